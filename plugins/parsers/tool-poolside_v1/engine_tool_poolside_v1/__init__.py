"""Poolside v1 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="poolside_v1",
    family="tool_parser",
    implementation="engine_tool_poolside_v1.impl",
    description="poolside Laguna tool calls: <tool_call>NAME\n<arg_key>/<arg_value> pairs",
)
