"""MiMo tool calls: Qwen3-Coder XML with HTML-unescaped, untrimmed values."""
from engine.api.parsers import FunctionFormat, XmlToolParser, ValueTyping
from engine.api import hookimpl

MIMO_TYPING = ValueTyping(html=True, typed="schema", untyped="raw", null_word=True)

FORMAT = FunctionFormat(typing=MIMO_TYPING)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
