"""The ling3 reasoning parser: a configuration of the shared tag splitter."""

from engine.api.parsers import ParserFactory
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory(
        "ling3",
        policy="enable_thinking",
        chat_template=chat_template,
        options=options,
        tool_starts=("<tool_call>",),
        nonempty_default=True,
        nonempty_when_streaming=False,
        nonempty_blockers=("<tool_call>",),
    )
