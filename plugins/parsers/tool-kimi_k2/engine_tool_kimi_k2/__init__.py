"""Kimi K2 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="kimi_k2",
    family="tool_parser",
    implementation="engine_tool_kimi_k2.impl",
    description=(
        "Kimi K2 tool calls: "
        "<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>JSON"
    ),
)
