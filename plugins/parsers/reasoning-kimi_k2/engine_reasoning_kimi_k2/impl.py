"""The kimi_k2 reasoning parser: a configuration of the shared tag splitter."""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory(
        "kimi_k2",
        policy="thinking",
        chat_template=chat_template,
        options=options,
        tool_starts=("<|tool_calls_section_begin|>",),
    )
