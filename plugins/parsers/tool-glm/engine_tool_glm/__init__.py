"""GLM-4.5 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="glm",
    family="tool_parser",
    implementation="engine_tool_glm.impl",
    description="GLM-4.5/4.6 tool calls: <tool_call>NAME\n<arg_key>/<arg_value> pairs",
)
