"""Kimi K3 XTML tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="kimi_k3",
    family="tool_parser",
    implementation="engine_tool_kimi_k3.impl",
    description='Kimi K3 XTML tool calls: <|open|>tools<|sep|><|open|>call tool=...>...',
)
