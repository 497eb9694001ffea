"""Mistral tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="mistral",
    family="tool_parser",
    implementation="engine_tool_mistral.impl",
    description='Mistral tool calls: [TOOL_CALLS] JSON array or name[ARGS]{...} units',
)
