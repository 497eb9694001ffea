"""MiniCPM5 tool calls: <function name=...><param name=...> elements without a wrapper."""
from engine.api.parsers import InvokeFormat, XmlToolParser, ValueTyping
from engine.api import hookimpl

MINICPM_TYPING = ValueTyping(cdata=True, typed="eval", untyped="raw")

FORMAT = InvokeFormat(
    invoke=("function",), param=("param",), bare=True, check_params=True, typing=MINICPM_TYPING
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
