"""MiniCPM5 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="minicpm5",
    family="tool_parser",
    implementation="engine_tool_minicpm5.impl",
    description="MiniCPM-4/5 tool calls: <function name=...><param name=...> elements",
)
