"""Interfaces of the two parser families. Standard library only: parsers never import torch.

One parser instance serves one response (one choice of one request). The same instance is used
either whole (``parse``) or streamed (``feed`` per decoded chunk, then ``finish``), never both.

Contract shared by both families: for any split of a text into chunks, the concatenation of
everything ``feed``/``finish`` emit equals what ``parse`` returns for the whole text (reasoning,
content, and each call's name and arguments), except where a format's fact sheet documents a
deliberate asymmetry (then the parser's docstring says so). Parsers never raise on model output:
anything that is not a well-formed element of the format is passed through as content.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


# --------------------------------------------------------------------------- reasoning


@dataclass
class ReasoningDelta:
    """A piece of reasoning and/or content; also the result of a whole-text parse."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class ReasoningParser(ABC):
    """Splits model text into ``reasoning_content`` and normal content.

    ``prefill_prefix``: text the format's chat template renders before a continued assistant
    message (``continue_final_message``); the pipeline reads it ahead of the prefill. DeepSeek-V4
    renders the continued message as the answer, after ``</think>``, so its parser sets
    ``"</think>"`` and the continuation is content.
    """

    prefill_prefix: str = ""

    @abstractmethod
    def parse(self, text: str) -> ReasoningDelta:
        """Split a whole response."""

    @abstractmethod
    def feed(self, chunk: str) -> ReasoningDelta:
        """Take the next decoded chunk; return what can be emitted now (partial markers held)."""

    @abstractmethod
    def finish(self) -> ReasoningDelta:
        """The stream ended: flush anything held back."""

    def reasoning_section(self) -> dict[str, Any] | None:
        """Where this response's reasoning sits, for a constraint that applies after it (a
        forced tool call): ``{"start": marker, "end": marker, "open": bool}`` (``open``: the
        response starts inside the reasoning; else it may open with ``start``), ``{}`` when
        the response has no reasoning section, or None (the default) when this parser cannot
        say: the constraint is then checked after generation instead."""
        return None


# --------------------------------------------------------------------------- tool calls


@dataclass
class ToolCall:
    """A complete call. ``arguments`` is a JSON object text: canonically
    ``json.dumps(args, ensure_ascii=False)`` unless the format documents other separators."""

    name: str
    arguments: str


@dataclass
class ToolCallDelta:
    """A streamed piece of call ``index`` (0-based order of calls in this response).

    The first delta of a call carries ``name`` (and possibly an arguments fragment); later ones
    carry ``name=None`` and a fragment. Concatenated fragments equal ``ToolCall.arguments``.
    """

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass
class ToolResult:
    """Whole-text result: the remaining normal text, and the calls in order."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolDelta:
    """What a streamed chunk yields: normal text to emit, and call pieces."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


class ToolParser(ABC):
    """Extracts tool calls from (the content part of) model text.

    ``tools`` is the request's OpenAI ``tools`` array. A call naming a function that is not in
    ``tools`` is not a call: its text is returned as content.
    """

    def __init__(self, *, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = list(tools or [])
        self.tool_names = {
            t.get("function", {}).get("name") for t in self.tools if isinstance(t, dict)
        }

    def tool_schema(self, name: str) -> dict[str, Any]:
        """The JSON schema of a tool's parameters (``{}`` if unknown)."""
        for t in self.tools:
            fn = t.get("function", {}) if isinstance(t, dict) else {}
            if fn.get("name") == name:
                return fn.get("parameters") or {}
        return {}

    def callable_names(self, forced: str) -> list[str]:
        """The tool names a forced choice allows: ``forced`` alone, or every tool (sorted)."""
        names = sorted(n for n in self.tool_names if isinstance(n, str))
        return [n for n in names if not forced or n == forced]

    def call_object_schema(self, name: str, name_key: str, args_key: str) -> dict[str, Any]:
        """The JSON schema of a call object ``{name_key: name, args_key: ARGS}`` (ARGS valid
        against the tool's parameters)."""
        return {"type": "object",
                "properties": {name_key: {"const": name},
                               args_key: self.tool_schema(name) or {"type": "object"}},
                "required": [name_key, args_key], "additionalProperties": False}

    def call_constraint(self, forced: str, parallel: bool) -> Any:
        """The constraint that makes the output valid calls in this format (a
        :class:`engine.api.grammar.GrammarSpec` of kind ``tool_calls``), for ``tool_choice``
        ``required`` (``forced`` is ``""``: any of ``tools``) or a named function (``forced``);
        ``parallel``: one or more calls, else exactly one. None (the default) when the format
        provides none: the choice is then checked after generation."""
        return None

    @abstractmethod
    def parse(self, text: str) -> ToolResult:
        """Parse a whole response."""

    @abstractmethod
    def feed(self, chunk: str) -> ToolDelta:
        """Take the next chunk; return content and call pieces that are certain now."""

    @abstractmethod
    def finish(self) -> ToolDelta:
        """The stream ended: flush held text (an unfinished call is returned as content)."""
