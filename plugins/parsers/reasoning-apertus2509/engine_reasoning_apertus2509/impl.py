"""Swiss AI Apertus: ``<|inner_prefix|>`` … ``<|inner_suffix|>`` reasoning blocks.

Never forced: text is content, and each inner block (there may be several, interleaved with
text) is reasoning. A tool block ``<|tools_prefix|>`` … ``<|tools_suffix|>`` inside a reasoning
block is moved, framing included, into content for the tool parser; reasoning resumes after it.
An unclosed reasoning block at the end is reasoning; an unclosed tool block is content.
Partial markers are held back.
"""

from __future__ import annotations

from engine.parsers.reasoning import (
    ParserFactory,
    StreamingReasoningParser,
    find_first,
    partial_tail,
)
from engine.plugins import hookimpl

INNER_PREFIX, INNER_SUFFIX = "<|inner_prefix|>", "<|inner_suffix|>"
TOOLS_PREFIX, TOOLS_SUFFIX = "<|tools_prefix|>", "<|tools_suffix|>"

_TEXT, _THINK, _TOOL = range(3)


class Apertus2509ReasoningParser(StreamingReasoningParser):
    """Splits Apertus output (see the module docstring)."""

    def __init__(self, **base) -> None:
        super().__init__(**base)
        self._state = _TEXT

    def _step(self, final: bool) -> tuple[str, str]:
        r: list[str] = []
        c: list[str] = []
        buf = self._buf
        while True:
            st = self._state
            markers = {_TEXT: (INNER_PREFIX,), _THINK: (INNER_SUFFIX, TOOLS_PREFIX),
                       _TOOL: (TOOLS_SUFFIX,)}[st]
            out = r if st == _THINK else c
            i, m = find_first(buf, markers)
            if i == -1:
                keep = 0 if final else partial_tail(buf, markers)
                out.append(buf[: len(buf) - keep])
                buf = buf[len(buf) - keep:]
                break
            out.append(buf[:i])
            if m == INNER_PREFIX:
                buf, self._state, self._reasoning_open = buf[i + len(m):], _THINK, True
            elif m == INNER_SUFFIX:
                buf, self._state, self._reasoning_open = buf[i + len(m):], _TEXT, False
            elif m == TOOLS_PREFIX:
                c.append(m)
                buf, self._state = buf[i + len(m):], _TOOL
            else:
                c.append(m)
                buf, self._state = buf[i + len(m):], _THINK
        self._buf = buf
        return "".join(r), "".join(c)


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("apertus2509", Apertus2509ReasoningParser, policy=None, options=options)
