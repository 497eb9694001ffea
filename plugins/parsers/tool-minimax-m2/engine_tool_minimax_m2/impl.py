"""MiniMax-M2 tool calls: invoke/parameter XML inside <minimax:tool_call>."""
from engine.api.parsers import SCHEMA_TYPING, InvokeFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = InvokeFormat(
    blocks=(("<minimax:tool_call>", ("</minimax:tool_call>",)),), typing=SCHEMA_TYPING
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
