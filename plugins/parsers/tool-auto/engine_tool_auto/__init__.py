"""Automatic tool-call parser choice plugin (manifest only)."""
from engine.api import Plugin

plugin = Plugin(
    name="auto",
    family="tool_parser",
    implementation="engine_tool_auto.impl",
    description=(
        "Picks the tool-call parser from the chat template (fact sheet §4) and "
        "delegates to it"
    ),
)
