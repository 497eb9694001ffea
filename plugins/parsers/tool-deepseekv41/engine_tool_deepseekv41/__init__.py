"""DeepSeek-V4.1 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="deepseekv41",
    family="tool_parser",
    implementation="engine_tool_deepseekv41.impl",
    description="DeepSeek-V4.1 tool calls: DSML <｜DSML｜ calls> blocks (spaced tag names)",
)
