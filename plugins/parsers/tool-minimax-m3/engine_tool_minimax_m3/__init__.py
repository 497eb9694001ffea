"""MiniMax-M3 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="minimax-m3",
    family="tool_parser",
    implementation="engine_tool_minimax_m3.impl",
    description="MiniMax-M3 tool calls: ]<]minimax[>[ namespaced tags, one tag per parameter",
)
