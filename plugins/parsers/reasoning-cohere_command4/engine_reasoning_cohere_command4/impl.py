"""Cohere Command A (command4) blocks -> reasoning and content.

The output starts inside thinking whatever the request says (an echoed leading
``<|START_THINKING|>`` is stripped). Thinking ends at the first ``<|END_THINKING|>``,
``<|START_TEXT|>`` or ``<|START_ACTION|>``. Content is the text inside ``<|START_TEXT|>`` …
``<|END_TEXT|>`` blocks (markers removed; everything after ``<|START_TEXT|>`` when unclosed), and
an action block passes through raw from ``<|START_ACTION|>`` to the end for the tool parser.
Text between blocks after thinking is kept as content. Partial markers are held back.
"""

from __future__ import annotations

from engine.api.parsers import (
    MarkerStateParser,
    ParserFactory,
    strip_leading,
    take_until,
)
from engine.api import hookimpl

START_THINKING, END_THINKING = "<|START_THINKING|>", "<|END_THINKING|>"
START_TEXT, END_TEXT, START_ACTION = "<|START_TEXT|>", "<|END_TEXT|>", "<|START_ACTION|>"
THINK_ENDS = (END_THINKING, START_TEXT, START_ACTION)
OUT_MARKERS = (START_TEXT, START_ACTION)
TEXT_MARKERS = (END_TEXT, START_ACTION)

_LEAD, _THINK, _OUT, _TEXT, _RAW = range(5)
_MARKERS = {_THINK: THINK_ENDS, _OUT: OUT_MARKERS, _TEXT: TEXT_MARKERS}


class CohereCommand4ReasoningParser(MarkerStateParser):
    """Splits Command A output (see the module docstring)."""

    def _advance(self, buf: str, final: bool, r: list[str], c: list[str]) -> tuple[str, bool]:
        st = self._state
        if st == _LEAD:
            buf, _, wait = strip_leading(buf, START_THINKING, final)
            if not wait:
                self._state = _THINK
            return buf, not wait
        if st == _RAW:
            c.append(buf)
            return "", False
        m, buf = take_until(buf, _MARKERS[st], final, r if st == _THINK else c)
        if not m:
            return buf, False
        if st == _THINK:
            self._reasoning_open = False
        if m == START_ACTION:
            self._state = _RAW
        else:
            buf = buf[len(m):]
            self._state = _TEXT if m == START_TEXT else _OUT
        return buf, True


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("cohere_command4", CohereCommand4ReasoningParser, policy=None,
                         options=options)
