"""Gemma 4 tool calls with their own argument syntax (wire format and notes in README.md)."""
from __future__ import annotations

import math
import re
from typing import Any

from engine.api.parsers import (
    CallState,
    StreamingToolParser,
    close_block_after,
    match_token,
    skip_ws,
)
from engine.api import hookimpl

Q = '<|"|>'
END = "<tool_call|>"
_NAME = re.compile(r"[\w.\-]*")
_SCAN = re.compile(r'<\|"\|>|[{}\[\]]')
_INT = re.compile(r"-?\d+\Z")
_FLOAT = re.compile(r"-?\d+\.\d*(?:[eE][-+]?\d+)?\Z|-?\d+[eE][-+]?\d+\Z")
_BARE = {"true": True, "false": False, "null": None}


class _Bad(Exception):
    pass


def _value(s: str, i: int) -> tuple[Any, int]:
    i = skip_ws(s, i)
    if s.startswith(Q, i):
        j = s.find(Q, i + len(Q))
        if j < 0:
            raise _Bad
        return s[i + len(Q) : j], j + len(Q)
    if s.startswith("{", i):
        return _object(s, i)
    if s.startswith("[", i):
        out, i = [], skip_ws(s, i + 1)
        if s.startswith("]", i):
            return out, i + 1
        while True:
            v, i = _value(s, i)
            out.append(v)
            i = skip_ws(s, i)
            if s.startswith(",", i):
                i += 1
            elif s.startswith("]", i):
                return out, i + 1
            else:
                raise _Bad
    j = i
    while j < len(s) and s[j] not in ",}]":
        j += 1
    word = s[i:j].strip()
    if not word or Q in word or "{" in word or "[" in word:
        raise _Bad
    if _INT.match(word):
        return int(word), j
    if _FLOAT.match(word):
        number = float(word)
        return (number if math.isfinite(number) else word), j  # 1e999 keeps its text
    return _BARE.get(word, word), j


def _object(s: str, i: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i = skip_ws(s, i + 1)
    if s.startswith("}", i):
        return out, i + 1
    while True:
        i = skip_ws(s, i)
        if s.startswith(Q, i):
            k = s.find(Q, i + len(Q))
            if k < 0:
                raise _Bad
            key, i = s[i + len(Q) : k], skip_ws(s, k + len(Q))
        else:
            k = s.find(":", i)
            if k < 0:
                raise _Bad
            key, i = s[i:k].strip(), k
            if not key or any(c in key for c in ',{}[]<"'):
                raise _Bad
        if not s.startswith(":", i):
            raise _Bad
        out[key], i = _value(s, i + 1)
        i = skip_ws(s, i)
        if s.startswith(",", i):
            i += 1
        elif s.startswith("}", i):
            return out, i + 1
        else:
            raise _Bad


def parse_gemma_args(src: str) -> dict[str, Any] | None:
    """The argument object ``{key:value,...}`` of a Gemma 4 call, or None when malformed."""
    try:
        obj, end = _object(src, 0)
    except (_Bad, RecursionError):
        return None
    return obj if end == len(src) else None


class Gemma4ToolParser(StreamingToolParser):
    """``<|tool_call>call:NAME{...}<tool_call|>``; the name is emitted at ``{``, the arguments
    when the braces balance (string-aware)."""

    start_markers = ("<|tool_call>",)

    def advance(self, text, block, final):
        if not block.calls:
            j = match_token(text, block.scan, "call:", final)
            if j is None:
                return
            if j < 0:
                block.invalid = True
                return
            k = _NAME.match(text, j).end()
            if k >= len(text):
                if final or k - j > 256:
                    block.invalid = True
                return
            if text[k] != "{" or k == j:
                block.invalid = True
                return
            block.calls.append(CallState(name=text[j:k], start=block.start))
            block.args_at, block.depth, block.quoted, block.scan = k, 0, False, k
        call = block.calls[0]
        if not call.done:
            last = block.scan
            for m in _SCAN.finditer(text, block.scan):
                tok, last = m.group(), m.end()
                if tok == Q:
                    block.quoted = not block.quoted
                elif block.quoted:
                    continue
                elif tok in "{[":
                    block.depth += 1
                else:
                    block.depth -= 1
                    if block.depth == 0:
                        break
            if block.depth:
                block.scan = max(last, len(text) - len(Q) + 1)
                if final:
                    block.invalid = True
                return
            args = parse_gemma_args(text[block.args_at : last])
            if args is None:
                block.invalid = True
                return
            call.arguments, call.done, call.end = self.dump(args), True, last
            block.scan = last
        close_block_after(text, block, call, END, final)


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: Gemma4ToolParser(tools=tools)
