"""Apertus tool-call lists of single-key objects (wire format and notes in README.md)."""
from engine.api.parsers import JsonListParser
from engine.api import hookimpl


class ApertusToolParser(JsonListParser):
    start_markers = ("<|tools_prefix|>",)
    end_marker = "<|tools_suffix|>"
    element = "named"


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: ApertusToolParser(tools=tools)
