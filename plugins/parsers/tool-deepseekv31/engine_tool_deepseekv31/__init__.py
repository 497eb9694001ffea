"""DeepSeek V3.1 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="deepseekv31",
    family="tool_parser",
    implementation="engine_tool_deepseekv31.impl",
    description='DeepSeek V3.1 tool calls: NAME<｜tool▁sep｜>JSON units',
)
