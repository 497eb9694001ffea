"""dots tool calls: invoke/parameter XML or one JSON call inside <dots_function_call>."""
from engine.api.parsers import SCHEMA_TYPING, InvokeFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = InvokeFormat(
    blocks=(("<dots_function_call>", ("</dots_function_call>",)),),
    block_json=True,
    typing=SCHEMA_TYPING,
    drop_markers=("</dots_function_call>",),
    framing_tokens=True,
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
