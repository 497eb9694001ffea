"""Hermes tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="hermes",
    family="tool_parser",
    implementation="engine_tool_hermes.impl",
    description='Hermes tool calls: JSON inside <tool_call> tags, streamed incrementally',
)
