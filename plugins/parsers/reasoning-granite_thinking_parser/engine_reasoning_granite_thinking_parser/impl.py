"""The granite_thinking_parser reasoning parser: a configuration of the shared tag splitter."""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory(
        "granite_thinking_parser",
        policy="enable_thinking",
        chat_template=chat_template,
        options=options,
        content_lstrip_newlines=True,
        nonempty_when_off=True,
    )
