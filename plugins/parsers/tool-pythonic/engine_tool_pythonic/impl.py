"""Pythonic call lists (wire format and notes in README.md)."""
from engine.parsers.json_tools import PythonicParser
from engine.plugins import hookimpl


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: PythonicParser(tools=tools)
