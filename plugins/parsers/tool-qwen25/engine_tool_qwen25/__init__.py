"""Qwen 2.5 / Qwen3 tool-call parser plugin (manifest only)."""
from engine.api import Plugin

plugin = Plugin(
    name="qwen25",
    family="tool_parser",
    implementation="engine_tool_qwen25.impl",
    description='Qwen 2.5 / Qwen3 tool calls: JSON inside <tool_call> tags',
)
