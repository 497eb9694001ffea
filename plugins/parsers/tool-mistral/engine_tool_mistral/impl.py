"""Mistral [TOOL_CALLS] calls, both variants (wire format and notes in README.md)."""
from engine.api.parsers import MistralParser
from engine.api import hookimpl


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: MistralParser(tools=tools)
