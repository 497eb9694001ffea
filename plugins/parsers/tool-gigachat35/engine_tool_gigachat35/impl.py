"""GigaChat 3.5 tool calls: GCML invoke/parameter blocks."""
from engine.api.parsers import DSML_TYPING, InvokeFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = InvokeFormat(
    blocks=(("<｜GCML｜tool_calls>", ("</｜GCML｜tool_calls>",)),),
    invoke=("｜GCML｜invoke",),
    param=("｜GCML｜parameter",),
    string_attr=True,
    json_body=True,
    typing=DSML_TYPING,
    drop_markers=("<|message_sep|>", "</s>"),
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
