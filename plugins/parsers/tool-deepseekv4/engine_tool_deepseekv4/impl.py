"""DeepSeek-V4 tool calls: strict DSML invoke/parameter blocks."""
from engine.api.parsers import DSML_TYPING, InvokeFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = InvokeFormat(
    blocks=(("<｜DSML｜tool_calls>", ("</｜DSML｜tool_calls>",)),),
    invoke=("｜DSML｜invoke",),
    param=("｜DSML｜parameter",),
    bare=True,
    string_attr=True,
    json_body=True,
    strict=True,
    typing=DSML_TYPING,
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
