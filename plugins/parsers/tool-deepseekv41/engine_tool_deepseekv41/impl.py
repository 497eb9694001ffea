"""DeepSeek-V4.1 tool calls: DSML blocks whose tag names start with a space."""
from engine.api.parsers import DSML_TYPING, InvokeFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = InvokeFormat(
    blocks=(("<｜DSML｜ calls>", ("</｜DSML｜ calls>",)),),
    invoke=("｜DSML｜ invoke",),
    param=("｜DSML｜ parameter",),
    string_attr=True,
    json_body=True,
    typing=DSML_TYPING,
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
