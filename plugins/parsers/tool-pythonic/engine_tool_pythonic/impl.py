"""Pythonic call lists (wire format and notes in README.md)."""
from engine.api.parsers import PythonicParser
from engine.api import hookimpl


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: PythonicParser(tools=tools)
