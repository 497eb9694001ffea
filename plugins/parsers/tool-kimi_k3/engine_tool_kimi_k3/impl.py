"""Kimi K3 XTML tools channel (wire format and notes in README.md)."""
from __future__ import annotations

import html
import re

from engine.api.parsers import (CallState, StreamingToolParser, loads_json, next_token,
                                skip_ws)
from engine.api import hookimpl

CALL_OPEN = "<|open|>call"
CALL_CLOSE = "<|close|>call<|sep|>"
TOOLS_CLOSE = "<|close|>tools<|sep|>"
_HEAD = re.compile(r"<\|open\|>call((?:\s+[\w-]+=\"[^\"]*\")*)\s*<\|sep\|>")
_ARG = re.compile(
    r"\s*<\|open\|>argument((?:\s+[\w-]+=\"[^\"]*\")*)\s*<\|sep\|>"
    r"(.*?)<\|close\|>argument<\|sep\|>",
    re.S,
)
_ATTR = re.compile(r"([\w-]+)=\"([^\"]*)\"")


def _attrs(src: str) -> dict[str, str]:
    return {k: html.unescape(v) for k, v in _ATTR.findall(src)}


def parse_call(src: str) -> tuple[str, dict] | None:
    """One ``<|open|>call ...<|sep|>ARGS<|close|>call<|sep|>`` unit -> (name, arguments); the
    name is ``""`` for a call without a ``tool`` attribute (skipped, as SGLang does)."""
    m = _HEAD.match(src)
    if m is None or not src.endswith(CALL_CLOSE):
        return None
    name = _attrs(m.group(1)).get("tool")
    body, args, i = src[m.end() : len(src) - len(CALL_CLOSE)], {}, 0
    for a in _ARG.finditer(body):
        if a.start() != i:
            return None
        at = _attrs(a.group(1))
        if "key" not in at:
            return None
        raw = a.group(2)
        if at.get("type", "string") == "string":
            args[at["key"]] = raw
        else:
            try:
                args[at["key"]] = loads_json(raw)
            except ValueError:
                args[at["key"]] = raw
        i = a.end()
    if body[i:].strip():
        return None
    return name or "", args


class KimiK3ToolParser(StreamingToolParser):
    """``<|open|>tools<|sep|>`` calls ``<|close|>tools<|sep|>``; each call is emitted when its
    ``<|close|>call<|sep|>`` arrives. Response wrappers, the message close and a stray think
    close are removed from the content, also without their ``<|sep|>``; a marker cut by the end
    of the stream is dropped, and so is a tools channel cut inside a call (after the calls it
    completed). A call without a ``tool`` attribute is skipped."""

    start_markers = ("<|open|>tools<|sep|>",)
    drop_markers = ("<|open|>response<|sep|>", "<|close|>response<|sep|>",
                    "<|close|>message<|sep|>", "<|close|>think<|sep|>",
                    "<|close|>response", "<|close|>message", "<|close|>think")
    cut_prefixes = ("<|open|>", "<|close|>")
    conformance_samples = (
        '<|open|>response<|sep|>Checking.<|close|>response<|sep|><|open|>tools<|sep|>'
        '<|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
        'type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key="days" '
        'type="integer"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>'
        '<|open|>call tool="get_time" index="2"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
        '<|open|>tools<|sep|>\n<|open|>call tool="get_time" index="1"<|sep|><|open|>argument '
        'key="tz" type="string"<|sep|>a &amp; <|sep b<|close|>argument<|sep|><|close|>call<|sep|>',
        '<|open|>tools<|sep|><|open|>call index="1"<|sep|><|close|>call<|sep|>'
        '<|open|>call tool="get_weather" index="2"<|sep|><|open|>argument key="city" '
        'type="string"<|sep|>Oslo<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'
        '<|close|>message<|sep|>',
    )

    def advance(self, text, block, final):
        while True:
            at = getattr(block, "call_at", None)
            if at is None:
                rest = text[skip_ws(text, block.scan):]
                if final and any(t.startswith(rest) for t in (CALL_OPEN, TOOLS_CLOSE)):
                    block.end, block.replace = len(text), ""  # cut between calls: dropped
                    return
                found = next_token(text, block, (CALL_OPEN, TOOLS_CLOSE), final)
                if found is None:
                    return
                i, tok, j = found
                if tok == TOOLS_CLOSE:
                    block.end = j
                    if not block.calls:  # framing only (or nameless calls): no content
                        block.replace = ""
                    return
                block.call_at, block.scan = i, j
                continue
            k = text.find(CALL_CLOSE, block.scan)
            if k < 0:
                block.scan = max(block.scan, len(text) - len(CALL_CLOSE) + 1)
                if final:  # cut by the end of the stream: framing and a partial call, dropped
                    block.end, block.replace = len(text), ""
                return
            end = k + len(CALL_CLOSE)
            parsed = parse_call(text[at:end])
            if parsed is None:
                block.invalid = True
                return
            if parsed[0]:
                block.calls.append(CallState(parsed[0], self.dump(parsed[1]), True, at, end))
            block.call_at, block.scan = None, end


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: KimiK3ToolParser(tools=tools)
