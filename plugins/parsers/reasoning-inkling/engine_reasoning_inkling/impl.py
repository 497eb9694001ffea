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

from engine.api.parsers import MarkerStateParser, ParserFactory, find_first, take_until
from engine.api import hookimpl

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


class InklingReasoningParser(MarkerStateParser):
    """Splits Inkling output (see the module docstring)."""

    def __init__(self, **base) -> None:
        super().__init__(**base)
        self._kind = ""

    def _advance(self, buf: str, final: bool, r: list[str], c: list[str]) -> tuple[str, bool]:
        st = self._state
        if st == _OUT:
            m, buf = take_until(buf, OUTSIDE_MARKERS, final, c)
            if not m:
                return buf, False
            if m == MESSAGE:
                self._state = _HEADER
            elif m in KINDS:
                buf = self._open("", m, buf[len(m):], c)
            else:
                buf = buf[len(m):]
            return buf, True
        if st == _HEADER:
            i, m = find_first(buf, HEADER_MARKERS, len(MESSAGE))
            if i == -1:
                if final:
                    c.append(buf[len(MESSAGE):])
                    buf = ""
                return buf, False
            if m == MESSAGE:
                c.append(buf[len(MESSAGE):i])
                return buf[i:], True
            return self._open(buf[:i], m, buf[i + len(m):], c), True
        m, buf = take_until(buf, BODY_MARKERS, final, r if self._kind == "reasoning" else c)
        if not m:
            return buf, False
        if m == END:
            if self._kind == "tool":
                c.append(END)
            buf = buf[len(END):]
        if self._kind == "reasoning":
            self._reasoning_open = False
        self._state = _OUT
        return buf, True

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
