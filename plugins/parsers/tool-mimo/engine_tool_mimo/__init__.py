"""MiMo tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="mimo",
    family="tool_parser",
    implementation="engine_tool_mimo.impl",
    description="Xiaomi MiMo tool calls: Qwen3-Coder XML, HTML-unescaped values",
)
