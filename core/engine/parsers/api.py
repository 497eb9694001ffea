"""Turn raw model output into an OpenAI assistant message: the parser pipeline as a Python API.

Pipeline (fact sheet §0.1): the reasoning parser splits the text into reasoning and normal text;
the tool-call parser runs on the normal text only, and only when ``tools`` are given.

>>> parse_message("<think>plan</think>Hi", reasoning_parser="deepseek-r1")
{'reasoning_content': 'plan', 'content': 'Hi', 'tool_calls': []}

Streaming: :class:`MessageStream` takes decoded chunks and returns OpenAI-style deltas;
``assemble(deltas)`` builds the whole message from them and equals :func:`parse_message` on the
same text (tool-call ids aside).

Continuing a prefilled assistant message (a chat request's ``continue_final_message``):
``prefill`` is the text the message already holds; the parsers read it first, so they start in
the state it left them in (after ``<think>work</think>The answer is `` the continuation is
content), and none of its text is returned again. The pieces of a call it holds are returned
with the continuation (a call it began is completed by it).
A continuation reads as the whole message would: after a reasoning block the prefill closed, a
new open marker in the continuation is answer text (SGLang starts a fresh block there). A
parser's ``prefill_prefix`` is read ahead of the prefill (DeepSeek-V4 renders a continued
message after ``</think>``).

``separate_reasoning=False`` keeps the reasoning text, markers removed, ahead of the answer in
``content``, and calls are read from the answer only (SGLang skips the reasoning parser then and
returns the raw text).

Parsers are given by name (resolved through the installed plugins with
:func:`engine.assembly.parser_factory`; a server passes the factories it built once at
start-up) or as a factory object: a reasoning factory is called as
``factory(chat_template_kwargs=..., reasoning_effort=...)``, a tool factory as
``factory(tools=...)``.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterable

from engine.parsers.base import ReasoningParser, ToolCallDelta, ToolParser

Factory = Callable[..., Any]


def reasoning_factory(parser: str | Factory, chat_template: str | None = None) -> Factory:
    """The per-request factory of a reasoning parser given by name or as a factory."""
    if isinstance(parser, str):
        from engine.assembly import parser_factory

        return parser_factory("reasoning_parser", parser, chat_template=chat_template)
    return parser


def tool_factory(parser: str | Factory, chat_template: str | None = None) -> Factory:
    """The per-request factory of a tool-call parser given by name or as a factory."""
    if isinstance(parser, str):
        from engine.assembly import parser_factory

        return parser_factory("tool_parser", parser, chat_template=chat_template)
    return parser


def call_constraint(tool_parser: ToolParser, reasoning_parser: ReasoningParser | None,
                    forced: str, parallel: bool) -> Any:
    """The constraint of a forced tool choice (``forced``: ``""`` for ``required``, else the
    tool's name): the tool parser's calls (:meth:`ToolParser.call_constraint`), after the
    reasoning section the reasoning parser describes
    (:meth:`ReasoningParser.reasoning_section`). None when either parser cannot give its part
    (the choice is then checked after generation)."""
    section: dict[str, Any] | None = {}
    if reasoning_parser is not None:
        section = reasoning_parser.reasoning_section()
        if section is None:
            return None
    spec = tool_parser.call_constraint(forced, parallel)
    if spec is None or not section:
        return spec
    import json

    from engine.api.grammar import GrammarSpec

    return GrammarSpec(spec.kind, json.dumps({**json.loads(spec.text), "reasoning": section}))


def new_call_id() -> str:
    """An OpenAI-style tool-call id: ``call_`` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


class _Pipeline:
    """The per-response parser pair built from the shared keyword arguments."""

    def __init__(
        self,
        *,
        reasoning_parser: str | Factory | None,
        tool_parser: str | Factory | None,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any] | None,
        reasoning_effort: str | None,
        chat_template: str | None,
        separate_reasoning: bool,
    ) -> None:
        self.separate = separate_reasoning
        self.reasoning: ReasoningParser | None = None
        self.tools: ToolParser | None = None
        if reasoning_parser is not None:
            factory = reasoning_factory(reasoning_parser, chat_template)
            self.reasoning = factory(chat_template_kwargs=dict(chat_template_kwargs or {}),
                                     reasoning_effort=reasoning_effort)
        if tool_parser is not None and tools:
            self.tools = tool_factory(tool_parser, chat_template)(tools=list(tools))

        self.carried: list[ToolCallDelta] = []

    def prime(self, prefill: str) -> None:
        """Read the prefilled start of the message; its output is not returned, except the
        pieces of a call it began (carried into the first delta)."""
        if self.reasoning is not None:
            normal = self.reasoning.feed(self.reasoning.prefill_prefix + prefill).content
        else:
            normal = prefill
        if self.tools is not None and normal:
            self.carried = list(self.tools.feed(normal).calls)

    def place(self, reasoning: str, content: str) -> tuple[str, str]:
        """With ``separate_reasoning=False`` reasoning text goes into content ahead of it."""
        return (reasoning, content) if self.separate else ("", reasoning + content)


def parse_message(
    text: str,
    *,
    reasoning_parser: str | Factory | None = None,
    tool_parser: str | Factory | None = None,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    reasoning_effort: str | None = None,
    chat_template: str | None = None,
    separate_reasoning: bool = True,
    prefill: str | None = None,
) -> dict[str, Any]:
    """Parse one whole response into ``{"reasoning_content", "content", "tool_calls"}``.

    ``reasoning_content``/``content`` are ``None`` when empty; ``tool_calls`` is a list of
    ``{"id": "call_<24 hex>", "type": "function", "function": {"name", "arguments"}}``
    (``arguments`` a JSON text). ``separate_reasoning=False``: the reasoning text (markers
    removed) stays in ``content`` ahead of the normal text, which is where the common formats
    have it; tool calls are still read from the normal text only. ``prefill``: see the module
    docstring (the text parsed is then the continuation alone).
    """
    if prefill:
        stream = MessageStream(
            reasoning_parser=reasoning_parser, tool_parser=tool_parser, tools=tools,
            chat_template_kwargs=chat_template_kwargs, reasoning_effort=reasoning_effort,
            chat_template=chat_template, separate_reasoning=separate_reasoning,
            prefill=prefill)
        return assemble([stream.feed(text), stream.finish()])
    pipe = _Pipeline(
        reasoning_parser=reasoning_parser, tool_parser=tool_parser, tools=tools,
        chat_template_kwargs=chat_template_kwargs, reasoning_effort=reasoning_effort,
        chat_template=chat_template, separate_reasoning=separate_reasoning,
    )
    if pipe.reasoning is not None:
        split = pipe.reasoning.parse(text)
        reasoning, normal = split.reasoning, split.content
    else:
        reasoning, normal = "", text
    calls: list[dict[str, Any]] = []
    if pipe.tools is not None:
        result = pipe.tools.parse(normal)
        normal = result.content
        calls = [
            {"id": new_call_id(), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in result.calls
        ]
    reasoning, content = pipe.place(reasoning, normal)
    return {"reasoning_content": reasoning or None, "content": content or None,
            "tool_calls": calls}


class MessageStream:
    """Streams one response: ``feed(chunk)`` per decoded chunk, then ``finish()``.

    Each call returns an OpenAI-style delta holding only non-empty keys among
    ``reasoning_content``, ``content`` and ``tool_calls``. A tool call's first delta is
    ``{"index", "id", "type": "function", "function": {"name", "arguments"}}``; later ones are
    ``{"index", "function": {"arguments": fragment}}``. Keyword arguments as
    :func:`parse_message`.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._pipe = _Pipeline(
            reasoning_parser=kwargs.pop("reasoning_parser", None),
            tool_parser=kwargs.pop("tool_parser", None),
            tools=kwargs.pop("tools", None),
            chat_template_kwargs=kwargs.pop("chat_template_kwargs", None),
            reasoning_effort=kwargs.pop("reasoning_effort", None),
            chat_template=kwargs.pop("chat_template", None),
            separate_reasoning=kwargs.pop("separate_reasoning", True),
        )
        prefill = kwargs.pop("prefill", None)
        if kwargs:
            raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(kwargs))}")
        self._ids: dict[int, str] = {}
        self._finished = False
        if prefill:
            self._pipe.prime(prefill)

    def feed(self, chunk: str) -> dict[str, Any]:
        """Take the next decoded chunk and return the delta it makes certain."""
        if self._finished:
            raise RuntimeError("MessageStream.feed() after finish()")
        if self._pipe.reasoning is not None:
            split = self._pipe.reasoning.feed(chunk)
            reasoning, normal = split.reasoning, split.content
        else:
            reasoning, normal = "", chunk
        return self._delta(reasoning, normal, final=False)

    def finish(self) -> dict[str, Any]:
        """The stream ended: flush everything held back."""
        if self._finished:
            return {}
        self._finished = True
        reasoning = normal = ""
        if self._pipe.reasoning is not None:
            split = self._pipe.reasoning.finish()
            reasoning, normal = split.reasoning, split.content
        return self._delta(reasoning, normal, final=True)

    def _delta(self, reasoning: str, normal: str, *, final: bool) -> dict[str, Any]:
        pieces, self._pipe.carried = self._pipe.carried, []
        tp = self._pipe.tools
        if tp is not None:
            content_parts: list[str] = []
            steps = [tp.feed(normal)] if normal else []
            if final:
                steps.append(tp.finish())
            for step in steps:
                content_parts.append(step.content)
                pieces.extend(step.calls)
            normal = "".join(content_parts)
        reasoning, content = self._pipe.place(reasoning, normal)
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        calls = self._call_deltas(pieces)
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _call_deltas(self, pieces: Iterable[ToolCallDelta]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        by_index: dict[int, dict[str, Any]] = {}
        for p in pieces:
            item = by_index.get(p.index)
            if item is None and p.index not in self._ids:
                self._ids[p.index] = new_call_id()
                item = {"index": p.index, "id": self._ids[p.index], "type": "function",
                        "function": {"name": p.name or "", "arguments": p.arguments}}
            elif item is None:
                if not p.arguments:
                    continue
                item = {"index": p.index, "function": {"arguments": p.arguments}}
            else:
                item["function"]["arguments"] += p.arguments
                continue
            by_index[p.index] = item
            out.append(item)
        return out


def assemble(deltas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Build the whole message (as :func:`parse_message` returns it) from streamed deltas."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        reasoning.append(d.get("reasoning_content") or "")
        content.append(d.get("content") or "")
        for tc in d.get("tool_calls") or ():
            fn = tc.get("function") or {}
            call = calls.get(tc["index"])
            if call is None:
                call = calls[tc["index"]] = {
                    "id": tc.get("id") or new_call_id(), "type": "function",
                    "function": {"name": fn.get("name") or "", "arguments": ""},
                }
            elif fn.get("name") and not call["function"]["name"]:
                call["function"]["name"] = fn["name"]
            call["function"]["arguments"] += fn.get("arguments") or ""
    return {
        "reasoning_content": "".join(reasoning) or None,
        "content": "".join(content) or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
    }
