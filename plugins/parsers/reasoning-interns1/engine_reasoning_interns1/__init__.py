"""The interns1 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="interns1",
    family="reasoning_parser",
    implementation="engine_reasoning_interns1.impl",
    description="Intern-S1: <think>...</think>, on unless enable_thinking=false",
)
