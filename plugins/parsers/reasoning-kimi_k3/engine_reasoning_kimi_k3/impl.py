"""Kimi K3 XTML channels -> reasoning and content.

``<|open|>think<|sep|>`` … ``<|close|>think<|sep|>`` is reasoning (a leading think-open is
stripped; when forced, the text starts inside reasoning). Reasoning also ends at the first
``<|open|>response<|sep|>`` or ``<|open|>tools<|sep|>``. Content is unwrapped: the response
open/close and ``<|close|>message<|sep|>`` markers are removed; a tools channel and everything
after it pass through raw for the tool parser. Response and message closes inside reasoning are
framing too (removed).

Recovery, as SGLang's kimi_k3 detector: a close marker whose ``<|sep|>`` is missing
(``<|close|>think<|open|>response<|sep|>…``) still closes its channel; a marker cut by the end of
the stream (``max_tokens`` stops between its tokens, leaving ``<|close|>``, ``<|close|>think``,
``<|open|>respo``…: a tail starting with ``<|open|>`` or ``<|close|>`` that is a prefix of a
marker) is dropped, in reasoning and in content alike. Not forced: text is content until a
think-open marker.

``force_nonempty_content``: a whole parse of text with no think markers but with a response or
message close is an answer (parsed unforced); a stream re-emits its reasoning as content at the
end instead (documented asymmetry).
"""

from __future__ import annotations

from engine.api.parsers import ReasoningDelta
from engine.api.parsers import (
    MarkerStateParser,
    ParserFactory,
    partial_tail,
    strip_leading,
    take_until,
)
from engine.api import hookimpl

THINK_OPEN, THINK_CLOSE = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
RESP_OPEN, RESP_CLOSE = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
MSG_CLOSE, TOOLS_OPEN = "<|close|>message<|sep|>", "<|open|>tools<|sep|>"
#: close markers without their ``<|sep|>`` (read as the full marker unless it is still arriving)
BARE_THINK_CLOSE, BARE_RESP_CLOSE, BARE_MSG_CLOSE = (
    m[: -len("<|sep|>")] for m in (THINK_CLOSE, RESP_CLOSE, MSG_CLOSE))
BARE = {BARE_THINK_CLOSE: THINK_CLOSE, BARE_RESP_CLOSE: RESP_CLOSE, BARE_MSG_CLOSE: MSG_CLOSE}
THINK_ENDS = (THINK_CLOSE, RESP_OPEN, TOOLS_OPEN, BARE_THINK_CLOSE)
#: framing that may stand inside reasoning: removed, reasoning goes on
THINK_DROPS = (RESP_CLOSE, MSG_CLOSE, BARE_RESP_CLOSE, BARE_MSG_CLOSE)
CONTENT_MARKERS = (RESP_OPEN, RESP_CLOSE, MSG_CLOSE, TOOLS_OPEN, THINK_OPEN, BARE_RESP_CLOSE,
                   BARE_MSG_CLOSE, THINK_CLOSE, BARE_THINK_CLOSE)
ALL_MARKERS = (THINK_OPEN, THINK_CLOSE, RESP_OPEN, RESP_CLOSE, MSG_CLOSE, TOOLS_OPEN,
               "<|close|>tools<|sep|>")
CUT_PREFIXES = ("<|open|>", "<|close|>")


def cut_tail(text: str) -> str:
    """``text`` without a trailing marker cut by the end of the stream (see the docstring)."""
    n = partial_tail(text, ALL_MARKERS)
    if n and text[-n:].startswith(CUT_PREFIXES):
        return text[:-n]
    return text


def waits_for_sep(buf: str, m: str, final: bool) -> bool:
    """``buf`` starts with the bare close ``m`` and may still grow into its full marker."""
    return m in BARE and not final and BARE[m].startswith(buf[: len(BARE[m])])

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
            m, buf = take_until(buf, THINK_ENDS + THINK_DROPS, False, r)  # held tails judged here
            if not m:
                if final:
                    r.append(cut_tail(buf))  # a marker cut by max_tokens is dropped
                    return "", False
                return buf, False
            if waits_for_sep(buf, m, final):
                return buf, False
            if m in THINK_DROPS:
                return buf[len(m):], True
            self._reasoning_open = False
            if m == TOOLS_OPEN:
                self._state = _RAW
            else:
                buf, self._state = buf[len(m):], _CONTENT
            return buf, True
        if st == _CONTENT:
            m, buf = take_until(buf, CONTENT_MARKERS, False, c)
            if not m:
                if final:
                    c.append(cut_tail(buf))
                    return "", False
                return buf, False
            if waits_for_sep(buf, m, final):
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
