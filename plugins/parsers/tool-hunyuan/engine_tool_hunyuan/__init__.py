"""Hunyuan tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="hunyuan",
    family="tool_parser",
    implementation="engine_tool_hunyuan.impl",
    description="Hunyuan HY-V3 tool calls: <tool_call>NAME<tool_sep> key/value pairs",
)
