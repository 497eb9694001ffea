"""K2 Horizon tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="k2_horizon",
    family="tool_parser",
    implementation="engine_tool_k2_horizon.impl",
    description="K2 Horizon tool calls: <ifm|tool_call> key/value pairs or JSON bodies",
)
