"""Nanbeige tool calls: Qwen3-Coder XML, or a JSON call object, inside <tool_call>."""
from engine.api.parsers import FunctionFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = FunctionFormat(json_body=True)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
