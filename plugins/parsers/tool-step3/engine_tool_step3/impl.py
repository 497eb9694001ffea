"""Step3 tool calls: <steptml:invoke> inside <｜tool_calls_begin｜> sections."""
from engine.api.parsers import InvokeFormat, XmlToolParser, ValueTyping
from engine.api import hookimpl

STEP3_TYPING = ValueTyping(trim="strip", typed="eval", untyped="raw")

FORMAT = InvokeFormat(
    blocks=(("<｜tool_calls_begin｜>", ("<｜tool_calls_end｜>",)),),
    invoke=("steptml:invoke",),
    param=("steptml:parameter",),
    call_wrap=("<｜tool_call_begin｜>", "<｜tool_sep｜>", "<｜tool_call_end｜>"),
    typing=STEP3_TYPING,
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
