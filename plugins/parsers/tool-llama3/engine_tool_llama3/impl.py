"""Llama 3.1/3.2/3.3 JSON calls (wire format and notes in README.md)."""
from engine.api.parsers import JsonSequenceParser
from engine.api import hookimpl


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: JsonSequenceParser(tools=tools)
