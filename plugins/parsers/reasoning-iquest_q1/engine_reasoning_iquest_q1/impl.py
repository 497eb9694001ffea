"""The iquest_q1 reasoning parser: a configuration of the shared tag splitter."""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("iquest_q1", policy="either_toggle", template_overrides=False, options=options)
