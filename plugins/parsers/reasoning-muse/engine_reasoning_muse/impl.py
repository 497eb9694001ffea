"""Muse Glimmer recipient channels -> reasoning and content.

The prompt ends at ``<|start|>assistant``, so the first header (`` to=self<|message|>``) comes
without ``<|start|>``; every later header must begin with ``<|start|>``. A header is
``[<|start|>][assistant][ to=RECIPIENT]<|message|>`` (no recipient means ``user``); the body
ends at ``<|eom|>`` or ``<|eot|>`` (or a new ``<|start|>``).

* ``to=self`` bodies are reasoning; several are joined with ``\\n``.
* ``to=user`` bodies are content, unwrapped (framing kept when ``keep_user_framing``, the
  plugin option for pipelines whose tool parser tells real channels from quoted ones).
* Any other recipient is a tool channel: header, body and terminator pass into content for the
  tool parser (``<|start|>assistant`` is put before a first header that lacks it).
* Anything else (a bare `` to=…`` mid-stream, text that is not a header) is content, as is a
  header left unfinished at the end. Partial markers are held back.
"""

from __future__ import annotations

import re

from engine.api.parsers import MarkerStateParser, ParserFactory, partial_tail, take_until
from engine.api import hookimpl

START, MESSAGE, EOM, EOT = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>"
BODY_MARKERS = (EOM, EOT, START)
_HEADER = re.compile(r"\s*(?:assistant)?\s*(?:to=([^\s<]+))?\s*")
_RECIPIENT_TAIL = re.compile(r"[^\s<]*\s*")

_HDR, _PROSE, _BODY = range(3)


class MuseReasoningParser(MarkerStateParser):
    """Splits Muse Glimmer output (see the module docstring)."""

    def __init__(self, *, keep_user_framing: bool = False, **base) -> None:
        super().__init__(**base)
        self.keep_user_framing = keep_user_framing
        self._first = True  # the first header may lack <|start|>
        self._kind = ""
        self._raw = ""  # the header as written, for the pass-through routes
        self._segments = 0

    def _advance(self, buf: str, final: bool, r: list[str], c: list[str]) -> tuple[str, bool]:
        st = self._state
        if st == _HDR:
            decided = self._header(buf, final, r, c)
            return (buf, False) if decided is None else (decided, True)
        if st == _PROSE:
            m, buf = take_until(buf, (START,), final, c)
            if m:
                self._state = _HDR
            return buf, bool(m)
        m, buf = take_until(buf, BODY_MARKERS, final, r if self._kind == "self" else c)
        if not m:
            return buf, False
        if m != START and self._kind != "self" and self._framed():
            c.append(m)
        if self._kind == "self":
            self._reasoning_open = False
        if m == START:
            self._state = _HDR
        else:
            buf, self._state = buf[len(m):], _PROSE
        return buf, True

    def _framed(self) -> bool:
        return self._kind == "tool" or self.keep_user_framing

    def _header(self, buf: str, final: bool, r: list[str], c: list[str]) -> str | None:
        """Decide a header at the start of ``buf``: the rest of ``buf``, or ``None`` to wait."""
        first, self._first = self._first, False
        body = buf
        if body.startswith(START):
            body = body[len(START):]
        elif not first:
            self._first = first
            if not final and START.startswith(body):
                return None
            self._state = _PROSE
            return buf
        elif not final and body and START.startswith(body):
            self._first = first
            return None
        i = body.find(MESSAGE)
        if i == -1:
            keep = partial_tail(body, (MESSAGE,))
            head = body[: len(body) - keep]
            if not final and _could_be_header(head):
                self._first = first
                return None
            self._state = _PROSE
            return buf if first else self._literal_start(buf, c)
        found = _HEADER.fullmatch(body[:i])
        if found is None:
            self._state = _PROSE
            return buf if first else self._literal_start(buf, c)
        recipient = found.group(1) or "user"
        self._kind = recipient if recipient in ("self", "user") else "tool"
        self._state = _BODY
        header = buf[: len(buf) - len(body) + i + len(MESSAGE)]
        if self._kind == "self":
            if self._segments:
                r.append("\n")
            self._segments += 1
            self._reasoning_open = True
        elif self._framed():
            if not header.startswith(START):
                header = START + ("" if header.lstrip().startswith("assistant") else "assistant") \
                    + header
            c.append(header)
        return body[i + len(MESSAGE):]

    @staticmethod
    def _literal_start(buf: str, c: list[str]) -> str:
        c.append(START)
        return buf[len(START):]


def _could_be_header(head: str) -> bool:
    """Whether ``head`` can still grow into a header (before its ``<|message|>``)."""
    s = head.lstrip()
    if "assistant".startswith(s):
        return True
    if s.startswith("assistant"):
        s = s[len("assistant"):].lstrip()
    if "to=".startswith(s):
        return True
    return s.startswith("to=") and _RECIPIENT_TAIL.fullmatch(s[3:]) is not None


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    keep = bool((options or {}).get("muse_keep_user_framing", False))
    return ParserFactory("muse", MuseReasoningParser, policy=None, options=options,
                         keep_user_framing=keep)
