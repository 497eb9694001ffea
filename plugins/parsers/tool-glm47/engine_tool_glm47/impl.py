"""GLM-4.7 tool calls: <arg_key>/<arg_value> pairs, the name ends at the first key."""
from engine.api.parsers import ArgPairFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = ArgPairFormat(name_end="key")


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
