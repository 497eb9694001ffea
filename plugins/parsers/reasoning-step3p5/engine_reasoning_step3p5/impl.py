"""The step3p5 reasoning parser: a configuration of the shared tag splitter."""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("step3p5", policy="always", template_overrides=False, options=options)
