"""Kimi K2 Instruct / Thinking tool-call sections (wire format and notes in README.md)."""
from engine.api.parsers import SectionParser
from engine.api import hookimpl


class KimiK2ToolParser(SectionParser):
    start_markers = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    section_end = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
    call_begin = "<|tool_call_begin|>"
    header_end = "<|tool_call_argument_begin|>"
    call_end = "<|tool_call_end|>"
    #: control tokens outside a section (stray, or left by a rejected one) are not content
    drop_markers = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>",
                    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
    framing_tokens = True

    def call_name(self, header):
        """``functions.NAME:IDX`` or ``NAME:IDX``; NAME may contain dots."""
        name = header.strip()
        if name.startswith("functions."):
            name = name[len("functions."):]
        base, sep, idx = name.rpartition(":")
        if sep and idx.isdigit():
            name = base
        return name if name and not any(c.isspace() for c in name) else None


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: KimiK2ToolParser(tools=tools)
