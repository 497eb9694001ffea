"""Gemma 4 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="gemma4",
    family="tool_parser",
    implementation="engine_tool_gemma4.impl",
    description='Gemma 4 tool calls: <|tool_call>call:NAME{key:value}<tool_call|>',
)
