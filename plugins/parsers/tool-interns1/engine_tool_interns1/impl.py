"""InternLM2 / Intern-S1 action blocks (wire format and notes in README.md)."""
from engine.api.parsers import JsonTagParser
from engine.api import hookimpl


class InternLMToolParser(JsonTagParser):
    start_markers = ("<|action_start|> <|plugin|>", "<|action_start|><|plugin|>")
    end_marker = "<|action_end|>"


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: InternLMToolParser(tools=tools)
