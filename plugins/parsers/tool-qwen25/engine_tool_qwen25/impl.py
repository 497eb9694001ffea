"""Qwen JSON calls in <tool_call> tags (wire format and notes in README.md)."""
from engine.api.parsers import JsonTagParser
from engine.api import hookimpl


class QwenToolParser(JsonTagParser):
    start_markers = ("<tool_call>",)
    end_marker = "</tool_call>"
    framing_tokens = True  # a rejected payload is content without its tags
    drop_markers = ("</tool_call>",)
    incremental = False


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: QwenToolParser(tools=tools)
