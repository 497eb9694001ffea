"""GLM-4.7 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="glm47",
    family="tool_parser",
    implementation="engine_tool_glm47.impl",
    description="GLM-4.7/GLM-5 tool calls: <tool_call>NAME<arg_key>/<arg_value> pairs, no newlines",
)
