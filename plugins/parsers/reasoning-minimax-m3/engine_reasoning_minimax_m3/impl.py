"""The minimax-m3 reasoning parser: a configuration of the shared tag splitter."""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory(
        "minimax-m3",
        policy="thinking_mode_enabled",
        template_overrides=False,
        options=options,
        start="<mm:think>",
        end="</mm:think>",
        drop_leading_end=True,
    )
