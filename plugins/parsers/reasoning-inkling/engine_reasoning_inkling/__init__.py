"""The inkling reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="inkling",
    family="reasoning_parser",
    implementation="engine_reasoning_inkling.impl",
    description="Inkling: typed message blocks (thinking, text, tool invocations)",
)
