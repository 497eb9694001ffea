"""DeepSeek-V3.2 tool calls: DSML invoke/parameter blocks (non-DSML tags accepted too)."""
from engine.api.parsers import DSML_TYPING, InvokeFormat, XmlToolParser
from engine.api import hookimpl

_CLOSE = ("</｜DSML｜function_calls>", "</function_calls>")
FORMAT = InvokeFormat(
    blocks=(("<｜DSML｜function_calls>", _CLOSE), ("<function_calls>", _CLOSE)),
    invoke=("｜DSML｜invoke", "invoke"),
    param=("｜DSML｜parameter", "parameter"),
    bare=True,
    string_attr=True,
    json_body=True,
    typing=DSML_TYPING,
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
