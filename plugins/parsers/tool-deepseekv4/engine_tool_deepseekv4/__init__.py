"""DeepSeek-V4 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="deepseekv4",
    family="tool_parser",
    implementation="engine_tool_deepseekv4.impl",
    description="DeepSeek-V4 tool calls: strict DSML <｜DSML｜tool_calls> invoke blocks",
)
