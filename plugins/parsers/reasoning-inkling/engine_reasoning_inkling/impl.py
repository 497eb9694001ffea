"""Inkling typed message blocks -> reasoning and content.

A block is ``<|message_model|>[header]<|content_KIND|>payload<|end_message|>``: ``thinking``
payloads are reasoning, ``text`` payloads content (the header of these is dropped). Tool blocks
(``<|content_invoke_tool_json|>``, ``…_text|>``, ``<|content_invoke_tool|>``) pass through into
content with their full framing (``<|message_model|>`` + header + token … ``<|end_message|>``)
for the tool parser. ``<|content_model_end_sampling|>``, ``<|model_trigger_generation|>`` and
stray ``<|end_message|>`` outside a block are dropped; a block may also start at its
``<|content_KIND|>`` token (header prefilled). Text with no control tokens is content; a header
left unfinished at the end is flushed as content. Partial control tokens are held back.
"""

from __future__ import annotations

from engine.parsers.reasoning import (
    ParserFactory,
    StreamingReasoningParser,
    find_first,
    partial_tail,
)
from engine.plugins import hookimpl

MESSAGE, END = "<|message_model|>", "<|end_message|>"
KINDS = {
    "<|content_thinking|>": "reasoning",
    "<|content_text|>": "content",
    "<|content_invoke_tool_json|>": "tool",
    "<|content_invoke_tool_text|>": "tool",
    "<|content_invoke_tool|>": "tool",
}
DROPPED = ("<|content_model_end_sampling|>", "<|model_trigger_generation|>", END)
OUTSIDE_MARKERS = (MESSAGE, *KINDS, *DROPPED)
HEADER_MARKERS = (*KINDS, MESSAGE)
BODY_MARKERS = (END, MESSAGE)

_OUT, _HEADER, _BODY = range(3)


class InklingReasoningParser(StreamingReasoningParser):
    """Splits Inkling output (see the module docstring)."""

    def __init__(self, **base) -> None:
        super().__init__(**base)
        self._state = _OUT
        self._kind = ""

    def _step(self, final: bool) -> tuple[str, str]:
        r: list[str] = []
        c: list[str] = []
        buf = self._buf
        while True:
            st = self._state
            if st == _OUT:
                i, m = find_first(buf, OUTSIDE_MARKERS)
                if i == -1:
                    keep = 0 if final else partial_tail(buf, OUTSIDE_MARKERS)
                    c.append(buf[: len(buf) - keep])
                    buf = buf[len(buf) - keep:]
                    break
                c.append(buf[:i])
                if m == MESSAGE:
                    buf, self._state = buf[i:], _HEADER
                elif m in KINDS:
                    buf = self._open("", m, buf[i + len(m):], c)
                else:
                    buf = buf[i + len(m):]
            elif st == _HEADER:
                i, m = find_first(buf, HEADER_MARKERS, len(MESSAGE))
                if i == -1:
                    if final:
                        c.append(buf[len(MESSAGE):])
                        buf = ""
                    break
                if m == MESSAGE:
                    c.append(buf[len(MESSAGE):i])
                    buf = buf[i:]
                    continue
                buf = self._open(buf[:i], m, buf[i + len(m):], c)
            else:
                i, m = find_first(buf, BODY_MARKERS)
                out = r if self._kind == "reasoning" else c
                if i == -1:
                    keep = 0 if final else partial_tail(buf, BODY_MARKERS)
                    out.append(buf[: len(buf) - keep])
                    buf = buf[len(buf) - keep:]
                    break
                out.append(buf[:i])
                if m == END:
                    if self._kind == "tool":
                        c.append(END)
                    buf = buf[i + len(END):]
                else:
                    buf = buf[i:]
                if self._kind == "reasoning":
                    self._reasoning_open = False
                self._state = _OUT
        self._buf = buf
        return "".join(r), "".join(c)

    def _open(self, header: str, token: str, rest: str, c: list[str]) -> str:
        self._kind = KINDS[token]
        self._state = _BODY
        if self._kind == "tool":
            c.append((header or MESSAGE) + token)
        elif self._kind == "reasoning":
            self._reasoning_open = True
        return rest


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("inkling", InklingReasoningParser, policy=None, options=options)
