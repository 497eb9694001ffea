"""The granite_thinking_parser reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="granite_thinking_parser",
    family="reasoning_parser",
    implementation="engine_reasoning_granite_thinking_parser.impl",
    description="IBM Granite 4.2: <think>...</think>, content without leading newlines",
)
