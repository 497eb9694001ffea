"""Poolside v1 tool calls: <arg_key>/<arg_value> pairs; unknown tools vanish."""
from engine.parsers.xml_tools import POOLSIDE_TYPING, ArgPairFormat, XmlToolParser
from engine.plugins import hookimpl

FORMAT = ArgPairFormat(name_end="flex", lenient=True, unknown="drop", typing=POOLSIDE_TYPING)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
