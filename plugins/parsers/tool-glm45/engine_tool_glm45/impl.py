"""GLM-4.5 tool calls: <arg_key>/<arg_value> pairs after a newline-terminated name."""
from engine.api.parsers import ArgPairFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = ArgPairFormat(name_end="newline")


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
