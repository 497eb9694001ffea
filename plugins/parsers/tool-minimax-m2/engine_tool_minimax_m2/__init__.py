"""MiniMax-M2 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="minimax-m2",
    family="tool_parser",
    implementation="engine_tool_minimax_m2.impl",
    description="MiniMax-M2 tool calls: <invoke>/<parameter> inside <minimax:tool_call>",
)
