"""Spark 2.5 tool calls: adjacent <arg_key><arg_value> pairs, compact arguments."""
from engine.parsers.xml_tools import SPARK_TYPING, ArgPairFormat, XmlToolParser
from engine.plugins import hookimpl

FORMAT = ArgPairFormat(name_end="flex", adjacent=True, compact=True, typing=SPARK_TYPING)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
