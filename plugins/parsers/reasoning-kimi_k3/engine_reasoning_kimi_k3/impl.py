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

from engine.parsers.base import ReasoningDelta
from engine.parsers.reasoning import (
    ParserFactory,
    StreamingReasoningParser,
    find_first,
    partial_tail,
)
from engine.plugins import hookimpl

THINK_OPEN, THINK_CLOSE = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
RESP_OPEN, RESP_CLOSE = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
MSG_CLOSE, TOOLS_OPEN = "<|close|>message<|sep|>", "<|open|>tools<|sep|>"
THINK_ENDS = (THINK_CLOSE, RESP_OPEN, TOOLS_OPEN)
CONTENT_MARKERS = (RESP_OPEN, RESP_CLOSE, MSG_CLOSE, TOOLS_OPEN, THINK_OPEN)
CUT_PREFIXES = ("<|open|>", "<|close|>")

_LEAD, _THINK, _CONTENT, _RAW = range(4)


class KimiK3ReasoningParser(StreamingReasoningParser):
    """Splits Kimi K3 XTML output (see the module docstring)."""

    def __init__(self, *, force_reasoning: bool = True, **base) -> None:
        super().__init__(**base)
        self.force_reasoning = force_reasoning
        self._state = _LEAD
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

    def _step(self, final: bool) -> tuple[str, str]:
        r: list[str] = []
        c: list[str] = []
        buf = self._buf
        while True:
            st = self._state
            if st == _LEAD:
                if buf.startswith(THINK_OPEN):
                    buf = buf[len(THINK_OPEN):]
                    self._in = True
                    continue
                if not final and THINK_OPEN.startswith(buf):
                    break
                self._state = _THINK if self._in else _CONTENT
                self._thought = self._thought or self._in
            elif st == _THINK:
                i, m = find_first(buf, THINK_ENDS)
                if i == -1:
                    keep = partial_tail(buf, THINK_ENDS)
                    tail = buf[len(buf) - keep:]
                    if final and not tail.startswith(CUT_PREFIXES):
                        keep = 0
                    r.append(buf[: len(buf) - keep])
                    buf = "" if final else tail
                    break
                r.append(buf[:i])
                self._reasoning_open = False
                if m == TOOLS_OPEN:
                    buf, self._state = buf[i:], _RAW
                else:
                    buf, self._state = buf[i + len(m):], _CONTENT
            elif st == _CONTENT:
                i, m = find_first(buf, CONTENT_MARKERS)
                if i == -1:
                    keep = 0 if final else partial_tail(buf, CONTENT_MARKERS)
                    c.append(buf[: len(buf) - keep])
                    buf = buf[len(buf) - keep:]
                    break
                c.append(buf[:i])
                if m == TOOLS_OPEN:
                    buf, self._state = buf[i:], _RAW
                elif m == THINK_OPEN and not self._thought:
                    buf, self._state, self._in = buf[i:], _LEAD, True
                    self._reasoning_open = True
                elif m == THINK_OPEN:
                    c.append(m)
                    buf = buf[i + len(m):]
                else:
                    buf = buf[i + len(m):]
            else:
                c.append(buf)
                buf = ""
                break
        self._buf = buf
        return "".join(r), "".join(c)


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("kimi_k3", KimiK3ReasoningParser, policy="thinking",
                         chat_template=chat_template, options=options)
