"""DeepSeek V3 / V3-0324 / R1 tool calls (wire format and notes in README.md)."""
from engine.api.parsers import SectionParser
from engine.api import hookimpl


class DeepSeekV3ToolParser(SectionParser):
    start_markers = ("<｜tool▁calls▁begin｜>",)
    section_end = ("<｜tool▁calls▁end｜>",)
    call_begin = "<｜tool▁call▁begin｜>"
    header_end = "```json"
    args_trailer = "```"
    call_end = "<｜tool▁call▁end｜>"

    def call_name(self, header):
        kind, sep, name = header.partition("<｜tool▁sep｜>")
        name = name.strip()
        return name if sep and kind.strip() == "function" and name else None


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: DeepSeekV3ToolParser(tools=tools)
