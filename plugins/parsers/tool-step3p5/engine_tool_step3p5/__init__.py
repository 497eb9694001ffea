"""Step-3.5 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="step3p5",
    family="tool_parser",
    implementation="engine_tool_step3p5.impl",
    description="Qwen3-Coder XML tool calls: <tool_call><function=NAME><parameter=KEY>",
)
