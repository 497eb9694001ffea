"""Liquid LFM2 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="lfm2",
    family="tool_parser",
    implementation="engine_tool_lfm2.impl",
    description=(
        "Liquid LFM2 tool calls: pythonic or JSON list inside "
        "<|tool_call_start|>...<|tool_call_end|>"
    ),
)
