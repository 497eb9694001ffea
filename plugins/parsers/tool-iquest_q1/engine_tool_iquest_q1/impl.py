"""IQuest Q1 tool calls: GLM-4.7 pairs inside <iquest_tool_call>."""
from engine.api.parsers import ArgPairFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = ArgPairFormat(call=("<iquest_tool_call>", "</iquest_tool_call>"), name_end="key")


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
