"""Muse Glimmer tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="muse",
    family="tool_parser",
    implementation="engine_tool_muse.impl",
    description="Muse Glimmer tool calls: ATEM invoke/parameter blocks in to=TOOL channels",
)
