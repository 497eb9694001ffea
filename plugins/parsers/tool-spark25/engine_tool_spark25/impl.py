"""Spark 2.5 tool calls: adjacent <arg_key><arg_value> pairs, compact arguments."""
from engine.api.parsers import ArgPairFormat, XmlToolParser, ValueTyping
from engine.api import hookimpl

SPARK_TYPING = ValueTyping(  # an undeclared parameter keeps its text, as the Spark protocol
    typed="schema",
    untyped="raw",
    null_word=True,
    true_words=("true", "1"),
    false_words=("false", "0"),
)

FORMAT = ArgPairFormat(name_end="flex", adjacent=True, compact=True, typing=SPARK_TYPING)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
