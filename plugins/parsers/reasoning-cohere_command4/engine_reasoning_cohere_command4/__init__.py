"""The cohere_command4 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="cohere_command4",
    family="reasoning_parser",
    implementation="engine_reasoning_cohere_command4.impl",
    description="Cohere Command A: thinking until <|END_THINKING|>, text/action blocks",
)
