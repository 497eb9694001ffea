"""Llama 3.x JSON tool-call parser plugin (manifest only; the implementation loads on selection)."""
from engine.api import Plugin

plugin = Plugin(
    name="llama3",
    family="tool_parser",
    implementation="engine_tool_llama3.impl",
    description="Llama 3.x JSON tool calls: <|python_tag|> or a leading JSON object, ';'-separated",
)
