"""Ling-3 tool calls: GLM-4.5 pairs; the name ends at a newline, the first key or </tool_call>."""
from engine.api.parsers import ArgPairFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = ArgPairFormat(name_end="flex")


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
