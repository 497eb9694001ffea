"""The mistral reasoning parser: a configuration of the shared tag splitter."""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory(
        "mistral",
        policy="effort_given",
        chat_template=chat_template,
        options=options,
        start="[THINK]",
        end="[/THINK]",
    )
