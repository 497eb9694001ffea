"""Step3 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="step3",
    family="tool_parser",
    implementation="engine_tool_step3.impl",
    description="StepFun Step-3 tool calls: steptml invoke/parameter inside DS-style tokens",
)
