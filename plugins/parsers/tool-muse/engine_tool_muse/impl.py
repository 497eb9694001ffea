"""Muse Glimmer tool calls: ATEM invoke/parameter blocks in ``to=RECIPIENT`` tool channels."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.api.parsers import (
    JSON_TYPING,
    InvokeFormat,
    ParsedCall,
    Region,
    ToolContext,
    ValueTyping,
    XmlToolParser,
    earliest,
)
from engine.api import hookimpl

HEADER = "<|start|>assistant"
MESSAGE = "<|message|>"
ENDS = ("<|eom|>", "<|eot|>")
ATEM = ("<atem:function_calls>", "</atem:function_calls>")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


def resolve_name(name: str, known: set) -> str:
    """A doubled namespace ``x.x`` becomes ``x``; otherwise a unique leaf match is used."""
    if name in known:
        return name
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == parts[1] and ".".join(parts[1:]) in known:
        return ".".join(parts[1:])
    leaf = parts[-1]
    hits = [k for k in known if isinstance(k, str) and (k == leaf or k.endswith("." + leaf))]
    return hits[0] if len(hits) == 1 else name


@dataclass(frozen=True)
class MuseFormat(InvokeFormat):
    """ATEM blocks as the body of a ``<|start|>assistant to=TOOL<|message|>`` channel ended by
    ``<|eom|>``/``<|eot|>`` (or by the end of the output once the block is complete). A
    ``to=user`` header (or one without ``to=``) and the terminators are framing: removed, the
    channel's text is content. ``to=self`` stays text. An ATEM block outside a tool channel
    (quoted in an answer or in reasoning) is text, never a call, as in the reference."""

    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ((ATEM[0], (ATEM[1],)),)
    invoke: tuple[str, ...] = ("atem:invoke",)
    param: tuple[str, ...] = ("atem:parameter",)
    typing: ValueTyping = JSON_TYPING
    drop_markers: tuple[str, ...] = ENDS

    @property
    def openers(self) -> tuple[str, ...]:
        return (HEADER,)

    def region(
        self, ctx: ToolContext, text: str, start: int, opener: str, final: bool, scan: int
    ) -> Region | None:
        if opener != HEADER:
            return super().region(ctx, text, start, opener, final, scan)
        m = text.find(MESSAGE, start)
        if m < 0:
            return Region(None, None) if final else None
        body_at = m + len(MESSAGE)
        found = _RECIPIENT.search(text, start + len(HEADER), m)
        recipient = found.group(1) if found else "user"
        if recipient == "user":
            return Region(body_at, [], dropped=True)
        if recipient == "self":
            return Region(body_at, None)
        j, end = earliest(text, ENDS, max(body_at, scan - 6))
        if j < 0:
            if not final:
                return None
            j, end = len(text), ""  # the output ended the channel: only a whole block counts
            if not _whole_block(text[body_at:]):
                return Region(None, None)
        body = text[body_at:j]
        inner = body.strip()
        if not (inner.startswith(ATEM[0]) and inner.endswith(ATEM[1])):
            return Region(j + len(end), None)
        at = body_at + body.index(ATEM[0]) + len(ATEM[0])
        calls = self.parse(ctx, ATEM[0], inner[len(ATEM[0]) : -len(ATEM[1])], at)
        return Region(j + len(end), calls)

    def parse(self, ctx: ToolContext, opener: str, body: str, at: int) -> list[ParsedCall] | None:
        calls = super().parse(ctx, opener, body, at)
        for c in calls or ():
            c.name = resolve_name(c.name, ctx.tool_names)
        return calls


def _whole_block(body: str) -> bool:
    inner = body.strip()
    return inner.startswith(ATEM[0]) and inner.endswith(ATEM[1])


FORMAT = MuseFormat()


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
