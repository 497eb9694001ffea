"""MiniMax-M2 tool calls: invoke/parameter XML inside <minimax:tool_call>."""
from engine.api.parsers import InvokeFormat, ValueTyping, XmlToolParser
from engine.api import hookimpl

#: SGLang's MiniMax-M2 conversion: boolean words beyond true/false, a whole float for a
#: number is an integer, ``none``/``nil`` are null where the schema admits null
TYPING = ValueTyping(
    typed="schema",
    untyped="json",
    null_word=True,
    true_words=("true", "1", "yes", "on"),
    false_words=("false", "0", "no", "off"),
    null_words=("null", "None", "none", "nil", ""),
    integral_numbers=True,
)
FORMAT = InvokeFormat(
    blocks=(("<minimax:tool_call>", ("</minimax:tool_call>",)),), typing=TYPING
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
