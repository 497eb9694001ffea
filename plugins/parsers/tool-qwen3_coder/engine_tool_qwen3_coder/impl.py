"""Qwen3-Coder tool calls: <function=NAME><parameter=KEY>value</parameter> inside <tool_call>."""
from engine.api.parsers import FunctionFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = FunctionFormat()

#: texts the conformance kit checks: a call, and two in one block with an implicit
#: parameter close
SAMPLES = (
    "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_time>\n<parameter=tz>UTC\n</function>\n<function=get_weather>\n"
    "<parameter=city>Oslo</parameter>\n</function>\n</tool_call>",
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT, samples=SAMPLES)
