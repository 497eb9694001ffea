"""Qwen3-Coder tool calls: <function=NAME><parameter=KEY>value</parameter> inside <tool_call>."""
from engine.api.parsers import FunctionFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = FunctionFormat()


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
