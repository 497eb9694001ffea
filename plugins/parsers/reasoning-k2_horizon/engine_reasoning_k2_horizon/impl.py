"""K2 Horizon (IFM tokens): the think-token pair is chosen by the reasoning effort.

high -> ``<ifm|think>``, medium -> ``<ifm|think_fast>``, low -> ``<ifm|think_faster>``; any
other value (or none) -> medium. The effort is read from ``chat_template_kwargs.reasoning_effort``
first, then the request's ``reasoning_effort``. Always forced (the template prefills the open
token); ``<ifm|tool_call`` (prefix of ``<ifm|tool_call>`` and ``<ifm|tool_calls>``) closes a turn
that omits the think-close token.
"""

from __future__ import annotations

from typing import Any

from engine.api.parsers import TagReasoningParser, nonempty_requested
from engine.api import hookimpl

WORDS = {"high": "think", "medium": "think_fast", "low": "think_faster"}
TOOL_START = "<ifm|tool_call"


class K2HorizonFactory:
    """Per-request factory: picks the marker pair from the effort."""

    def __init__(self, options: dict[str, Any] | None) -> None:
        self.stream_reasoning = bool((options or {}).get("stream_reasoning", True))

    def __repr__(self) -> str:
        return "K2HorizonFactory('k2_horizon')"

    def __call__(self, *, chat_template_kwargs: dict[str, Any] | None = None,
                 reasoning_effort: str | None = None) -> TagReasoningParser:
        kw = chat_template_kwargs if isinstance(chat_template_kwargs, dict) else {}
        word = WORDS.get(kw.get("reasoning_effort") or reasoning_effort, WORDS["medium"])
        return TagReasoningParser(
            start=f"<ifm|{word}>", end=f"</ifm|{word}>", tool_starts=(TOOL_START,),
            force_reasoning=True, stream_reasoning=self.stream_reasoning,
            force_nonempty_content=nonempty_requested(kw, False),
        )


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return K2HorizonFactory(options)
