"""Harmony (gpt-oss) channels -> reasoning and content.

Messages: ``[<|start|>ROLE]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY``
ended by ``<|end|>``, ``<|call|>`` or ``<|return|>`` (a new ``<|start|>``/``<|channel|>`` also ends
an unterminated body). ``analysis`` bodies are reasoning; ``final`` and recipient-less
``commentary`` bodies are content; a message with a recipient (a tool call, on ``commentary`` or
``analysis``) is passed into content raw, framing included, for the tool parser; it is prefixed
with ``<|start|>assistant`` when the model's output began inside that message. Other channels
are dropped. Text outside any message (no Harmony markers) is content, except a bare
``commentary`` written between a call's ``<|call|>`` and the next message (filler some
checkpoints emit between repeated calls), which is dropped. A tool *response* message
(``<|start|>functions.X to=assistant<|message|>…``: a role other than assistant/user/system
addressed to someone) is content, its body unwrapped. Analysis and final text stream at once; a
tool message is held until its terminator. Streamed == whole for every split.
"""

from __future__ import annotations

import re

from engine.api.parsers import MarkerStateParser, ParserFactory, take_until
from engine.api import hookimpl

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
OUTSIDE_MARKERS = (START, CHANNEL, *TERMINATORS)
BODY_MARKERS = (*TERMINATORS, START, CHANNEL)
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=[^\s<]+")
FILLER = "commentary"
ROLES = ("assistant", "user", "system")

_OUT, _HEADER, _BODY = range(3)


class HarmonyReasoningParser(MarkerStateParser):
    """Splits a Harmony channel stream (see the module docstring)."""

    def __init__(self, **base) -> None:
        super().__init__(**base)
        self._kind = ""  # body route: "reasoning", "content", "tool" or "skip"
        self._raw = ""  # a tool message held until its terminator
        self._after_call = False  # outside, right after a call's <|call|>

    def _advance(self, buf: str, final: bool, r: list[str], c: list[str]) -> tuple[str, bool]:
        if self._state == _OUT:
            out: list[str] = []
            m, buf = take_until(buf, OUTSIDE_MARKERS, final, out)
            text = "".join(out)
            if self._after_call and text:
                word = text.strip().lower()
                if not m and not final and FILLER.startswith(word):
                    return text + buf, False  # may still be the filler: wait for the marker
                self._after_call = False
                if not (m and m not in TERMINATORS and word == FILLER):
                    c.append(text)
            else:
                c.append(text)
            if not m:
                return buf, False
            if m in TERMINATORS:
                buf = buf[len(m):]
            else:
                self._state = _HEADER
            return buf, True
        if self._state == _HEADER:
            i = buf.find(MESSAGE)
            if i == -1:
                return ("" if final else buf), False
            self._open(buf[:i])
            return buf[i + len(MESSAGE):], True
        body: list[str] = []
        m, buf = take_until(buf, BODY_MARKERS, final, body)
        self._body("".join(body), r, c)
        if not m:
            if final:
                self._close("", c)
            return buf, False
        if m in TERMINATORS:
            self._after_call = m == "<|call|>" and self._kind == "tool"
            self._close(m, c)
            buf, self._state = buf[len(m):], _OUT
        else:
            self._close("", c)
            self._state = _HEADER
        return buf, True

    def _open(self, header: str) -> None:
        self._state = _BODY
        found = _CHANNEL_NAME.search(header)
        channel = found.group(1) if found else ""
        if _is_tool_response(header):
            self._kind = "content"
        elif _RECIPIENT.search(header):
            self._kind = "tool"
            prefix = "" if header.startswith(START) else START + "assistant"
            self._raw = prefix + header + MESSAGE
        elif channel == "analysis":
            self._kind = "reasoning"
            self._reasoning_open = True
        elif channel in ("final", "commentary"):
            self._kind = "content"
        else:
            self._kind = "skip"

    def _body(self, text: str, r: list[str], c: list[str]) -> None:
        if self._kind == "reasoning":
            r.append(text)
        elif self._kind == "content":
            c.append(text)
        elif self._kind == "tool":
            self._raw += text

    def _close(self, terminator: str, c: list[str]) -> None:
        if self._kind == "tool":
            c.append(self._raw + terminator)
            self._raw = ""
        elif self._kind == "reasoning":
            self._reasoning_open = False
        self._kind = "skip"


def _is_tool_response(header: str) -> bool:
    """``<|start|>functions.X to=assistant``: a tool's reply, not an assistant message."""
    if not header.startswith(START) or CHANNEL in header:
        return False
    role = header[len(START):].strip()
    return " to=" in role and "(" not in role and not role.lower().startswith(ROLES)


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return ParserFactory("gpt-oss", HarmonyReasoningParser, policy=None, options=options)
