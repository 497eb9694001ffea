"""K2 Horizon tool calls: IFM-token key/value pairs or JSON bodies."""
from engine.api.parsers import SCHEMA_TYPING, ArgPairFormat, XmlToolParser
from engine.api import hookimpl

FORMAT = ArgPairFormat(
    call=("<ifm|tool_call>", "</ifm|tool_call>"),
    group=("<ifm|tool_calls>", "</ifm|tool_calls>"),
    key=("<ifm|arg_key>", "</ifm|arg_key>"),
    val=("<ifm|arg_value>", "</ifm|arg_value>"),
    type_tag=("<ifm|arg_type>", "</ifm|arg_type>"),
    name_end="key",
    json_body=True,
    typing=SCHEMA_TYPING,
)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
