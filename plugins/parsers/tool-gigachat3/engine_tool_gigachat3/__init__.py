"""GigaChat 3 tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="gigachat3",
    family="tool_parser",
    implementation="engine_tool_gigachat3.impl",
    description=(
        "GigaChat 3 tool call: one JSON call after "
        "'function call<|role_sep|>' or <|function_call|>"
    ),
)
