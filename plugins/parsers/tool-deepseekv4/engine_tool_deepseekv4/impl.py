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

#: texts the conformance kit checks: a wrapped block (with a self-closing invoke), a bare
#: invoke and a bare self-closing one
SAMPLES = (
    'Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
    '<｜DSML｜invoke name="get_time"/>\n</｜DSML｜tool_calls>',
    '<｜DSML｜invoke name="get_time">\n'
    '<｜DSML｜parameter name="tz" string="true">UTC</｜DSML｜parameter>\n</｜DSML｜invoke>',
    '<｜DSML｜invoke name="get_time"/>',
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT, samples=SAMPLES)
