"""The auto reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="auto",
    family="reasoning_parser",
    implementation="engine_reasoning_auto.impl",
    description="Picks the reasoning parser from the chat template (fact sheet section 4)",
)
