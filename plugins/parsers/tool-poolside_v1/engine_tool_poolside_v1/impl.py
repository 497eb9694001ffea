"""Poolside v1 tool calls: <arg_key>/<arg_value> pairs; unknown tools vanish."""
from engine.api.parsers import ArgPairFormat, XmlToolParser, ValueTyping
from engine.api import hookimpl

POOLSIDE_TYPING = ValueTyping(trim="newline", typed="eval", untyped="json")

FORMAT = ArgPairFormat(name_end="flex", lenient=True, unknown="drop", typing=POOLSIDE_TYPING)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
