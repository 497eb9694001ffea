"""IQuest Q1 tool calls: GLM-4.7 pairs inside <iquest_tool_call>."""
from engine.parsers.xml_tools import ArgPairFormat, XmlToolParser
from engine.plugins import hookimpl

FORMAT = ArgPairFormat(call=("<iquest_tool_call>", "</iquest_tool_call>"), name_end="key")


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
