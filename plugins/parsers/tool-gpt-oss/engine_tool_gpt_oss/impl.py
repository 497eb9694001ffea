"""gpt-oss Harmony messages (wire format and notes in README.md)."""
from __future__ import annotations

import re

from engine.api.parsers import CallState, StreamingToolParser, loads_object
from engine.api import hookimpl

MESSAGE = "<|message|>"
ENDS = ("<|call|>", "<|end|>", "<|return|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CONTENT_CHANNELS = ("final", "commentary")


class HarmonyToolParser(StreamingToolParser):
    """Reads Harmony: ``[<|start|>ROLE]<|channel|>CH[ to=R][ <|constrain|>json]<|message|>BODY``
    ``<|call|>|<|end|>|<|return|>``.

    A message with recipient ``to=...X`` is a call of X (last dotted segment), JSON body, empty
    body ``{}``; emitted whole when its terminator arrives. ``final`` (and recipient-less
    ``commentary``) bodies are content, streamed; other channels (``analysis``) are dropped.
    Text without Harmony markers is content unchanged.
    """

    start_markers = ("<|start|>", "<|channel|>")
    drop_markers = ENDS

    def advance(self, text, block, final):
        if not hasattr(block, "kind"):
            k = text.find(MESSAGE, block.scan)
            stop = min((j for j in (text.find("<|start|>", block.scan),
                                    *(text.find(e, block.scan) for e in ENDS)) if j >= 0),
                       default=-1)
            if k < 0 or (0 <= stop < k):
                if stop >= 0 or final or len(text) - block.start > 512:
                    block.invalid = True
                else:
                    block.scan = max(block.scan, len(text) - len(MESSAGE) + 1)
                return
            header = text[block.start : k]
            ch = _CHANNEL.search(header)
            rcp = _RECIPIENT.search(header)
            block.body_at = block.scan = k + len(MESSAGE)
            if rcp:
                block.kind = "call"
                block.calls.append(CallState(start=block.start))
                block.tool = rcp.group(1).rsplit(".", 1)[-1]
            elif ch is None or ch.group(1) in _CONTENT_CHANNELS:
                block.end, block.replace = block.scan, ""
                return
            else:
                block.kind = "drop"
        hits = [(j, e) for e in ENDS if (j := text.find(e, block.scan)) >= 0]
        if not hits:
            block.scan = max(block.scan, len(text) - max(map(len, ENDS)) + 1)
            if final and block.kind == "drop":
                block.end, block.replace = len(text), ""
            return
        j, e = min(hits)
        block.end = j + len(e)
        if block.kind == "drop":
            block.replace = ""
            return
        body = text[block.body_at : j].strip()
        args = loads_object(body) if body else {}
        if args is None or not block.tool:
            block.invalid = True
            return
        call = block.calls[0]
        call.name, call.arguments = block.tool, self.dump(args)
        call.done, call.end = True, block.end


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: HarmonyToolParser(tools=tools)
