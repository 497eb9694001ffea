"""Ling-3 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="ling3",
    family="tool_parser",
    implementation="engine_tool_ling3.impl",
    description="Ling-3 (BailingMoeV3) tool calls: GLM-4.5 key/value pairs, flexible name end",
)
