"""Cohere Command A tool-call parser plugin (manifest only)."""
from engine.api import Plugin

plugin = Plugin(
    name="cohere_command4",
    family="tool_parser",
    implementation="engine_tool_cohere_command4.impl",
    description=(
        "Cohere Command A tool calls: <|START_ACTION|>[{tool_name, "
        "parameters}]<|END_ACTION|>"
    ),
)
