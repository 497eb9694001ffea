"""MiniCPM5 tool calls: <function name=...><param name=...> elements without a wrapper."""
from engine.parsers.xml_tools import MINICPM_TYPING, InvokeFormat, XmlToolParser
from engine.plugins import hookimpl

FORMAT = InvokeFormat(
    invoke=("function",), param=("param",), bare=True, check_params=True, typing=MINICPM_TYPING
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
