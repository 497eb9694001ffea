"""Cohere Command A action blocks (wire format and notes in README.md)."""
from engine.api.parsers import JsonListParser
from engine.api import hookimpl


class CohereToolParser(JsonListParser):
    start_markers = ("<|START_ACTION|>",)
    end_marker = "<|END_ACTION|>"
    drop_markers = ("<|END_ACTION|>",)
    framing_tokens = True
    bare_object = True
    name_keys = ("tool_name",)
    args_keys = ("parameters",)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: CohereToolParser(tools=tools)
