"""Cohere Command A (command4) blocks -> reasoning and content.

The output starts inside thinking whatever the request says (an echoed leading
``<|START_THINKING|>`` is stripped). Thinking ends at the first ``<|END_THINKING|>``,
``<|START_TEXT|>`` or ``<|START_ACTION|>``. Content is the text inside ``<|START_TEXT|>`` …
``<|END_TEXT|>`` blocks (markers removed; everything after ``<|START_TEXT|>`` when unclosed), and
an action block passes through raw from ``<|START_ACTION|>`` to the end for the tool parser.
Text between blocks after thinking is kept as content. Partial markers are held back.
"""

from __future__ import annotations

from engine.parsers.reasoning import (
    ParserFactory,
    StreamingReasoningParser,
    find_first,
    partial_tail,
)
from engine.plugins import hookimpl

START_THINKING, END_THINKING = "<|START_THINKING|>", "<|END_THINKING|>"
START_TEXT, END_TEXT, START_ACTION = "<|START_TEXT|>", "<|END_TEXT|>", "<|START_ACTION|>"
THINK_ENDS = (END_THINKING, START_TEXT, START_ACTION)
OUT_MARKERS = (START_TEXT, START_ACTION)
TEXT_MARKERS = (END_TEXT, START_ACTION)

_LEAD, _THINK, _OUT, _TEXT, _RAW = range(5)


class CohereCommand4ReasoningParser(StreamingReasoningParser):
    """Splits Command A output (see the module docstring)."""

    def __init__(self, **base) -> None:
        super().__init__(**base)
        self._state = _LEAD

    def _step(self, final: bool) -> tuple[str, str]:
        r: list[str] = []
        c: list[str] = []
        buf = self._buf
        while True:
            st = self._state
            if st == _LEAD:
                if buf.startswith(START_THINKING):
                    buf = buf[len(START_THINKING):]
                    continue
                if not final and START_THINKING.startswith(buf):
                    break
                self._state = _THINK
                continue
            if st == _RAW:
                c.append(buf)
                buf = ""
                break
            markers = {_THINK: THINK_ENDS, _OUT: OUT_MARKERS, _TEXT: TEXT_MARKERS}[st]
            out = r if st == _THINK else c
            i, m = find_first(buf, markers)
            if i == -1:
                keep = 0 if final else partial_tail(buf, markers)
                out.append(buf[: len(buf) - keep])
                buf = buf[len(buf) - keep:]
                break
            out.append(buf[:i])
            if st == _THINK:
                self._reasoning_open = False
            if m == START_ACTION:
                buf, self._state = buf[i:], _RAW
            else:
                buf = buf[i + len(m):]
                self._state = _TEXT if m == START_TEXT else _OUT
        self._buf = buf
        return "".join(r), "".join(c)


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("cohere_command4", CohereCommand4ReasoningParser, policy=None,
                         options=options)
