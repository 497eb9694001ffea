"""Pythonic tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="pythonic",
    family="tool_parser",
    implementation="engine_tool_pythonic.impl",
    description="Pythonic tool calls: a Python list [f(a=1), g(b='x')] of literal keyword calls",
)
