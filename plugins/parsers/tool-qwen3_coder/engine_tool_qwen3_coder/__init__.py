"""Qwen3-Coder tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="qwen3_coder",
    family="tool_parser",
    implementation="engine_tool_qwen3_coder.impl",
    description="Qwen3-Coder XML tool calls: <tool_call><function=NAME><parameter=KEY>",
)
