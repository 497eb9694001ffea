"""``--reasoning-parser auto``: detect the parser from the chat template and delegate to it.

The fact sheet's §4 rules (:func:`engine_reasoning_auto.detect.detect_reasoning_parser`) pick
a name; the assembly builds that plugin's factory with its own options and the same template.
With no template, or no rule matching, every response passes through as content.
"""

from __future__ import annotations

from typing import Any

from engine.api import hookimpl
from engine.api.parsers import ParserFactory, PassthroughReasoningParser

from engine_reasoning_auto.detect import detect_reasoning_parser


class AutoReasoningFactory:
    """Delegates to the detected parser's factory; ``picked`` is its name (``None``: none)."""

    def __init__(self, picked: str | None, factory: Any) -> None:
        self.picked, self.factory = picked, factory

    def __repr__(self) -> str:
        return f"AutoReasoningFactory(picked={self.picked!r})"

    def __call__(self, *, chat_template_kwargs: dict[str, Any] | None = None,
                 reasoning_effort: str | None = None) -> Any:
        return self.factory(chat_template_kwargs=chat_template_kwargs,
                            reasoning_effort=reasoning_effort)


@hookimpl
def engine_create_reasoning_parser(options, chat_template, delegate):
    picked = detect_reasoning_parser(chat_template)
    if picked is None:
        factory = ParserFactory("passthrough", PassthroughReasoningParser, policy=None,
                                options=options)
    else:
        factory = delegate(picked)
    return AutoReasoningFactory(picked, factory)
