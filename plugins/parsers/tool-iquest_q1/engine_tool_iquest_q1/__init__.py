"""IQuest Q1 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="iquest_q1",
    family="tool_parser",
    implementation="engine_tool_iquest_q1.impl",
    description="IQuest Q1 tool calls: <iquest_tool_call>NAME<arg_key>/<arg_value> pairs",
)
