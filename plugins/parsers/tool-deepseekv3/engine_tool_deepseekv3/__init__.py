"""DeepSeek V3 / R1 tool-call parser plugin (manifest only)."""
from engine.api import Plugin

plugin = Plugin(
    name="deepseekv3",
    family="tool_parser",
    implementation="engine_tool_deepseekv3.impl",
    description='DeepSeek V3 / R1 tool calls: function<｜tool▁sep｜>NAME and a ```json fence',
)
