"""MiMo tool calls: Qwen3-Coder XML with HTML-unescaped, untrimmed values."""
from engine.parsers.xml_tools import MIMO_TYPING, FunctionFormat, XmlToolParser
from engine.plugins import hookimpl

FORMAT = FunctionFormat(typing=MIMO_TYPING)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
