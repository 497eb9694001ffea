"""MiniMax-M2 inline reasoning: nothing is split; ``<think>`` is put before the text.

The template prefills ``<think>``, so the output is ``reasoning</think>answer``; this parser
returns it all as content with the open marker restored: ``<think>reasoning</think>answer``.
"""

from engine.api.parsers import ParserFactory, PassthroughReasoningParser
from engine.api import hookimpl


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("minimax-append-think", PassthroughReasoningParser, policy=None,
                         options=options, prefix="<think>")
