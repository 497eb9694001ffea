"""MiMo tool calls: Qwen3-Coder XML with HTML-unescaped, untrimmed values."""
from engine.api.parsers import FunctionFormat, XmlToolParser, ValueTyping
from engine.api import hookimpl

#: SGLang's MiMo conversion: ``null`` in any case is None, a whole float for a number is an
#: integer (``3.0`` -> 3)
MIMO_TYPING = ValueTyping(
    html=True, typed="schema", untyped="raw", null_word="any_case", integral_numbers=True
)

FORMAT = FunctionFormat(typing=MIMO_TYPING)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
