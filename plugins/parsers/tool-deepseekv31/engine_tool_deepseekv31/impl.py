"""DeepSeek V3.1 / V3.2-Exp tool calls (wire format and notes in README.md)."""
from engine.api.parsers import SectionParser
from engine.api import hookimpl


class DeepSeekV31ToolParser(SectionParser):
    start_markers = ("<｜tool▁calls▁begin｜>",)
    section_end = ("<｜tool▁calls▁end｜>",)
    call_begin = "<｜tool▁call▁begin｜>"
    header_end = "<｜tool▁sep｜>"
    call_end = "<｜tool▁call▁end｜>"


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: DeepSeekV31ToolParser(tools=tools)
