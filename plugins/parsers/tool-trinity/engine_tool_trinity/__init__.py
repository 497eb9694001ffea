"""Trinity tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="trinity",
    family="tool_parser",
    implementation="engine_tool_trinity.impl",
    description='Trinity tool calls: Qwen 2.5 format, <think> tags removed',
)
