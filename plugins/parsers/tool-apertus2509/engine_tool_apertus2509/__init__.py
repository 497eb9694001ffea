"""Swiss AI Apertus tool-call parser plugin (manifest only)."""
from engine.api import Plugin

plugin = Plugin(
    name="apertus2509",
    family="tool_parser",
    implementation="engine_tool_apertus2509.impl",
    description='Swiss AI Apertus tool calls: <|tools_prefix|>[{NAME: ARGS}, ...]<|tools_suffix|>',
)
