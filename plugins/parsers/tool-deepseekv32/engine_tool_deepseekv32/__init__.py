"""DeepSeek-V3.2 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="deepseekv32",
    family="tool_parser",
    implementation="engine_tool_deepseekv32.impl",
    description="DeepSeek-V3.2 tool calls: DSML <｜DSML｜function_calls> invoke/parameter blocks",
)
