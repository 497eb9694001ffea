"""Kimi K3 XTML channels -> reasoning and content.

``<|open|>think<|sep|>`` … ``<|close|>think<|sep|>`` is reasoning (a leading think-open is
stripped; when forced, the text starts inside reasoning). Reasoning also ends at the first
``<|open|>response<|sep|>`` or ``<|open|>tools<|sep|>``. Content is unwrapped: the response
open/close and ``<|close|>message<|sep|>`` markers are removed; a tools channel and everything
after it pass through raw for the tool parser. A partial marker left by a ``max_tokens`` cut at
the end of reasoning (held text starting with ``<|open|>`` or ``<|close|>``) is dropped.
Not forced: text is content until a think-open marker.

``force_nonempty_content``: a whole parse of text with no think markers but with a response or
message close is an answer (parsed unforced); a stream re-emits its reasoning as content at the
end instead (documented asymmetry).
"""

from __future__ import annotations

from engine.api.parsers import ReasoningDelta
from engine.api.parsers import (
    MarkerStateParser,
    ParserFactory,
    strip_leading,
    take_until,
)
from engine.api import hookimpl

THINK_OPEN, THINK_CLOSE = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
RESP_OPEN, RESP_CLOSE = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
MSG_CLOSE, TOOLS_OPEN = "<|close|>message<|sep|>", "<|open|>tools<|sep|>"
THINK_ENDS = (THINK_CLOSE, RESP_OPEN, TOOLS_OPEN)
CONTENT_MARKERS = (RESP_OPEN, RESP_CLOSE, MSG_CLOSE, TOOLS_OPEN, THINK_OPEN)
CUT_PREFIXES = ("<|open|>", "<|close|>")

_LEAD, _THINK, _CONTENT, _RAW = range(4)


class KimiK3ReasoningParser(MarkerStateParser):
    """Splits Kimi K3 XTML output (see the module docstring)."""

    def __init__(self, *, force_reasoning: bool = True, **base) -> None:
        super().__init__(**base)
        self.force_reasoning = force_reasoning
        self._in = force_reasoning
        self._thought = False

    def parse(self, text: str) -> ReasoningDelta:
        if (
            self.force_nonempty_content and self.force_reasoning
            and THINK_OPEN not in text and THINK_CLOSE not in text
            and (RESP_CLOSE in text or MSG_CLOSE in text)
        ):
            self.force_reasoning = self._in = False
        return super().parse(text)

    def stream_matches(self, whole: ReasoningDelta, streamed: ReasoningDelta) -> bool:
        if super().stream_matches(whole, streamed):
            return True
        return (self.force_nonempty_content and not whole.reasoning
                and streamed.content == streamed.reasoning)

    def _advance(self, buf: str, final: bool, r: list[str], c: list[str]) -> tuple[str, bool]:
        st = self._state
        if st == _LEAD:
            buf, stripped, wait = strip_leading(buf, THINK_OPEN, final)
            self._in = self._in or stripped
            if wait:
                return buf, False
            self._state = _THINK if self._in else _CONTENT
            self._thought = self._thought or self._in
            return buf, True
        if st == _THINK:
            m, buf = take_until(buf, THINK_ENDS, False, r)  # a held tail is judged here
            if not m:
                if final and not buf.startswith(CUT_PREFIXES):
                    r.append(buf)  # not a marker cut by max_tokens: plain reasoning
                return ("" if final else buf), False
            self._reasoning_open = False
            if m == TOOLS_OPEN:
                self._state = _RAW
            else:
                buf, self._state = buf[len(m):], _CONTENT
            return buf, True
        if st == _CONTENT:
            m, buf = take_until(buf, CONTENT_MARKERS, final, c)
            if not m:
                return buf, False
            if m == TOOLS_OPEN:
                self._state = _RAW
            elif m == THINK_OPEN and not self._thought:
                self._state, self._in = _LEAD, True
                self._reasoning_open = True
            else:
                if m == THINK_OPEN:
                    c.append(m)
                buf = buf[len(m):]
            return buf, True
        c.append(buf)
        return "", False


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("kimi_k3", KimiK3ReasoningParser, policy="thinking",
                         chat_template=chat_template, options=options)
