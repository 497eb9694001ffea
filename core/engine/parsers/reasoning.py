"""Shared machinery of the reasoning-parser family. Standard library only.

* :class:`StreamingReasoningParser`: base of every state-machine parser here. Subclasses write one
  incremental ``_step``; ``parse`` is ``feed(text)`` + ``finish()``, so whole and streamed results
  agree by construction. It also implements ``stream_reasoning=False`` (reasoning buffered until
  it closes) and ``force_nonempty_content`` (fact sheet §0.3).
* :class:`MarkerStateParser` with :func:`take_until` and :func:`strip_leading`: the loop and
  marker scanning of hand-written state machines (the plugins' channel formats).
* :class:`TagReasoningParser`: the ``<start>``…``<end>`` splitter with optional tool-start markers
  (implicit close of reasoning), forcing, and the newline-trimming Granite variant.
* :class:`ReasoningPolicy` and :func:`template_policy`: whether reasoning is on for a request
  (§0.2) and what the chat template says about it (§4 step 2).
* :class:`ParserFactory`: the per-request factory plugins return.
* :func:`detect_reasoning_parser`: the §4 step 3 rules ``auto`` uses.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable

from engine.parsers.base import ReasoningDelta, ReasoningParser

# --------------------------------------------------------------------------- marker helpers


def partial_tail(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``."""
    best = 0
    n = len(text)
    for m in markers:
        if not m:
            continue
        i = text.find(m[0], max(0, n - len(m) + 1))
        while i != -1 and n - i > best:
            if m.startswith(text[i:]):
                best = n - i
                break
            i = text.find(m[0], i + 1)
    return best


def find_first(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str]:
    """The earliest occurrence of any of ``markers`` at or after ``start``: ``(index, marker)``,
    or ``(-1, "")``. On a tie the longer marker wins."""
    best, found = -1, ""
    for m in markers:
        i = text.find(m, start)
        if i != -1 and (best == -1 or i < best or (i == best and len(m) > len(found))):
            best, found = i, m
    return best, found


def take_until(buf: str, markers: tuple[str, ...], final: bool, out: list[str]) -> tuple[str, str]:
    """Move the text of ``buf`` before the earliest of ``markers`` into ``out``.

    Returns ``(marker, rest)``. With a marker found, ``rest`` starts at that marker. Otherwise
    ``marker`` is ``""`` and ``rest`` is the tail held back because it may still grow into a
    marker (nothing is held when ``final``)."""
    i, m = find_first(buf, markers)
    if i == -1:
        keep = 0 if final else partial_tail(buf, markers)
        out.append(buf[: len(buf) - keep])
        return "", buf[len(buf) - keep:]
    out.append(buf[:i])
    return m, buf[i:]


def strip_leading(buf: str, marker: str, final: bool) -> tuple[str, bool, bool]:
    """Remove copies of ``marker`` from the start of ``buf``: ``(rest, stripped, wait)``, where
    ``wait`` says that ``rest`` may still grow into another copy (more text is needed)."""
    stripped = False
    while buf.startswith(marker):
        buf, stripped = buf[len(marker):], True
    return buf, stripped, not final and marker.startswith(buf)


# --------------------------------------------------------------------------- base


class StreamingReasoningParser(ReasoningParser):
    """Base of incremental reasoning parsers: subclasses implement :meth:`_step`.

    ``_step(final)`` consumes ``self._buf`` (the unsettled tail: held partial markers plus new
    text), keeps in it only what cannot be decided yet (nothing when ``final``), and returns the
    ``(reasoning, content)`` decided now. Subclasses set ``self._reasoning_open = False`` when a
    reasoning section closes (it releases buffered reasoning when ``stream_reasoning`` is off).

    ``force_nonempty_content`` (fact sheet §0.3): a whole parse whose content is empty moves the
    reasoning into content; a stream instead re-emits the accumulated reasoning as content at
    ``finish()`` (documented asymmetry; ``nonempty_when_streaming=False`` disables it for
    formats where the rule is whole-parse only). ``nonempty_blockers``: the swap is skipped when
    the text contains one of these (e.g. a tool-call marker). Content counts as present when the
    format wrote any, even text a subclass then trims away (Granite's newlines after the close):
    the swap is for a response that has no answer at all, as in the reference.
    """

    def __init__(
        self,
        *,
        stream_reasoning: bool = True,
        force_nonempty_content: bool = False,
        nonempty_when_streaming: bool = True,
        nonempty_blockers: tuple[str, ...] = (),
        prefill_prefix: str = "",
    ) -> None:
        self.prefill_prefix = prefill_prefix
        self.stream_reasoning = stream_reasoning
        self.force_nonempty_content = force_nonempty_content
        self.nonempty_when_streaming = nonempty_when_streaming
        self.nonempty_blockers = nonempty_blockers
        self._buf = ""
        self._reasoning_open = True
        self._held: list[str] = []
        self._content_seen = False
        self._reasoning_log: list[str] = []
        self._whole = False

    @abstractmethod
    def _step(self, final: bool) -> tuple[str, str]:
        """Consume ``self._buf``; return the ``(reasoning, content)`` decided now."""

    def feed(self, chunk: str) -> ReasoningDelta:
        if not chunk:
            return ReasoningDelta()
        self._buf += chunk
        return self._emit(*self._step(False), final=False)

    def finish(self) -> ReasoningDelta:
        delta = self._emit(*self._step(True), final=True)
        if (
            self.force_nonempty_content and self.nonempty_when_streaming and not self._whole
            and not self._content_seen and self._reasoning_log
        ):
            delta.content += "".join(self._reasoning_log)
        return delta

    def parse(self, text: str) -> ReasoningDelta:
        self._whole = True
        a, b = self.feed(text), self.finish()
        reasoning, content = a.reasoning + b.reasoning, a.content + b.content
        if (
            self.force_nonempty_content and reasoning and not content and not self._content_seen
            and not any(m in text for m in self.nonempty_blockers)
        ):
            reasoning, content = "", reasoning
        return ReasoningDelta(reasoning, content)

    def stream_matches(self, whole: ReasoningDelta, streamed: ReasoningDelta) -> bool:
        """Whether a streamed result is what the contract allows for this whole result: equal, or
        the documented ``force_nonempty_content`` asymmetry."""
        if whole == streamed:
            return True
        return (
            self.force_nonempty_content and not whole.reasoning
            and whole.content == streamed.reasoning
            and streamed.content == (streamed.reasoning if self.nonempty_when_streaming else "")
        )

    def _emit(self, reasoning: str, content: str, *, final: bool) -> ReasoningDelta:
        if reasoning and self.force_nonempty_content:
            self._reasoning_log.append(reasoning)
        if not self.stream_reasoning:
            if reasoning:
                self._held.append(reasoning)
            reasoning = ""
            if self._held and (final or not self._reasoning_open):
                reasoning = "".join(self._held)
                self._held.clear()
        if content:
            self._content_seen = True
        return ReasoningDelta(reasoning, content)


class PassthroughReasoningParser(StreamingReasoningParser):
    """Everything is content, optionally with ``prefix`` put before non-empty text."""

    def __init__(self, *, prefix: str = "", **base: Any) -> None:
        super().__init__(**base)
        self.prefix = prefix

    def reasoning_section(self) -> dict[str, Any] | None:
        return {}

    def _step(self, final: bool) -> tuple[str, str]:
        out, self._buf = self._buf, ""
        if out and self.prefix:
            out, self.prefix = self.prefix + out, ""
        return "", out


class MarkerStateParser(StreamingReasoningParser):
    """Base of hand-written marker state machines: subclasses implement :meth:`_advance`.

    ``self._state`` starts at ``0``; ``_step`` calls ``_advance`` until it asks for more text,
    and joins what it decided.
    """

    def __init__(self, **base: Any) -> None:
        super().__init__(**base)
        self._state = 0

    @abstractmethod
    def _advance(self, buf: str, final: bool, r: list[str], c: list[str]) -> tuple[str, bool]:
        """One move from ``self._state`` over ``buf``: append decided reasoning to ``r`` and
        content to ``c``; return ``(the rest of buf, whether to go on)``."""

    def _step(self, final: bool) -> tuple[str, str]:
        r: list[str] = []
        c: list[str] = []
        buf, more = self._buf, True
        while more:
            buf, more = self._advance(buf, final, r, c)
        self._buf = buf
        return "".join(r), "".join(c)


# --------------------------------------------------------------------------- <start>...<end>

_LEAD, _BEFORE, _THINK, _AFTER = range(4)


class TagReasoningParser(StreamingReasoningParser):
    """Splits ``[<start>]reasoning<end>content`` (fact sheet §0.3).

    * Forced (``force_reasoning``): the text starts inside reasoning. Start markers are stripped
      only at the very beginning (repeated copies too); elsewhere they are literal reasoning.
    * Not forced: text is content until a start marker; the marker is removed and reasoning
      begins there. (The whole-text rule of the fact sheet would also count the text *before* a
      mid-text start marker as reasoning; that cannot be streamed, so both modes here treat it
      as content.)
    * Reasoning ends at the first ``end`` marker; everything after is content forever.
    * ``tool_starts``: markers that close reasoning where they appear inside it, as SGLang's
      ``tool_start_token`` does (the model went from thinking straight to calling): the marker
      and everything after it are content, for the tool parser, and stream at once. These are
      the format's call tokens, which a model emits only to call (a later end marker is then
      plain content).
    * ``drop_leading_end``: when not in reasoning, one end marker at the start of the text
      (after whitespace) is dropped (a stray close left by a previous turn).
    * ``content_lstrip_newlines``: leading newlines of content are removed and whitespace-only
      content becomes empty.
    * Truncated reasoning (no end marker) is all reasoning; held partial markers are flushed into
      the section they were held in.
    """

    def __init__(
        self,
        *,
        start: str = "<think>",
        end: str = "</think>",
        tool_starts: tuple[str, ...] = (),
        force_reasoning: bool = False,
        drop_leading_end: bool = False,
        content_lstrip_newlines: bool = False,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.start, self.end, self.tool_starts = start, end, tuple(tool_starts)
        self.force_reasoning = force_reasoning
        self.drop_leading_end = drop_leading_end
        self.content_lstrip_newlines = content_lstrip_newlines
        self._state = _LEAD
        self._in = force_reasoning
        self._ws = ""
        self._content_started = False

    def reasoning_section(self) -> dict[str, Any] | None:
        """Reasoning is ``start``...``end`` at the beginning (already open when forced)."""
        return {"start": self.start, "end": self.end, "open": self.force_reasoning}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(start={self.start!r}, end={self.end!r}, "
                f"tool_starts={self.tool_starts!r}, force_reasoning={self.force_reasoning})")

    def _step(self, final: bool) -> tuple[str, str]:
        r: list[str] = []
        c: list[str] = []
        buf = self._buf
        start, end = self.start, self.end
        while True:
            st = self._state
            if st == _LEAD:
                if buf.startswith(start):
                    buf = buf[len(start):]
                    self._in = True
                    continue
                if self.drop_leading_end and not self._in:
                    stripped = buf.lstrip()
                    if stripped.startswith(end):
                        c.append(buf[: len(buf) - len(stripped)])
                        buf = stripped[len(end):]
                        self._state = _BEFORE
                        continue
                    if not final and end.startswith(stripped):
                        break
                if not final and start.startswith(buf):
                    break
                self._state = _THINK if self._in else _BEFORE
            elif st == _BEFORE:
                i = buf.find(start)
                if i != -1:
                    c.append(buf[:i])
                    buf = buf[i + len(start):]
                    self._in = True
                    self._state = _LEAD
                    continue
                keep = 0 if final else partial_tail(buf, (start,))
                c.append(buf[: len(buf) - keep])
                buf = buf[len(buf) - keep:]
                break
            elif st == _THINK:
                i, m = find_first(buf, (end, *self.tool_starts))
                if i != -1:
                    r.append(buf[:i])
                    buf = buf[i + len(end):] if m == end else buf[i:]
                    self._close()
                    continue
                keep = 0 if final else partial_tail(buf, (end, *self.tool_starts))
                r.append(buf[: len(buf) - keep])
                buf = buf[len(buf) - keep:]
                break
            else:
                c.append(buf)
                buf = ""
                break
        self._buf = buf
        return "".join(r), self._content("".join(c), final)

    def _close(self) -> None:
        self._state = _AFTER
        self._reasoning_open = False

    def _content(self, text: str, final: bool) -> str:
        if text:
            self._content_seen = True  # written, even if trimmed below
        if not self.content_lstrip_newlines or self._content_started:
            return text
        self._ws += text
        if self._ws.strip():
            self._content_started = True
            out, self._ws = self._ws.lstrip("\n"), ""
            return out
        if final:
            self._ws = ""
        return ""


# --------------------------------------------------------------------------- request policy


@dataclass(frozen=True)
class ReasoningPolicy:
    """Decides from a request whether reasoning is on (fact sheet §0.2).

    ``kind``: ``always``, ``never``, ``toggle`` (``key`` of ``chat_template_kwargs`` with a
    default), ``effort_given`` (``reasoning_effort`` set and not ``none``), ``effort_not_off``
    (effort not unset/``none``/``no_think``), ``thinking_mode`` (``thinking_mode ==
    "enabled"``) or ``aliased_toggles`` (``thinking``/``enable_thinking`` as aliases: on unless
    one is false and neither is true).
    """

    kind: str
    key: str = ""
    default_on: bool = True

    def enabled(self, chat_template_kwargs: dict[str, Any] | None,
                reasoning_effort: str | None) -> bool:
        kw = chat_template_kwargs if isinstance(chat_template_kwargs, dict) else {}
        if self.kind == "always":
            return True
        if self.kind == "never":
            return False
        if self.kind == "toggle":
            value = kw.get(self.key)
            return value is not False if self.default_on else value is True
        if self.kind == "effort_given":
            return reasoning_effort is not None and reasoning_effort != "none"
        if self.kind == "effort_not_off":
            return reasoning_effort not in (None, "", "none", "no_think")
        if self.kind == "thinking_mode":
            return kw.get("thinking_mode") == "enabled"
        if self.kind == "aliased_toggles":
            values = (kw.get("thinking"), kw.get("enable_thinking"))
            return True in values or False not in values
        raise ValueError(f"unknown reasoning policy kind {self.kind!r}")


#: the ``reasoning_default`` names of fact sheet §0.2 plus the special cases
POLICIES: dict[str, ReasoningPolicy] = {
    "always": ReasoningPolicy("always"),
    "never": ReasoningPolicy("never"),
    "enable_thinking": ReasoningPolicy("toggle", "enable_thinking", True),
    "thinking": ReasoningPolicy("toggle", "thinking", True),
    "explicit_enable_thinking": ReasoningPolicy("toggle", "enable_thinking", False),
    "explicit_thinking": ReasoningPolicy("toggle", "thinking", False),
    "effort_given": ReasoningPolicy("effort_given"),
    "effort_not_off": ReasoningPolicy("effort_not_off"),
    "thinking_mode_enabled": ReasoningPolicy("thinking_mode"),
    "either_toggle": ReasoningPolicy("aliased_toggles"),
}

def _default_patterns(key: str, value: str) -> list[re.Pattern[str]]:
    k = rf"(?<![A-Za-z_]){key}"
    pats = [
        rf"not\s+{k}\s+is\s+defined\s*-?%\}}\s*\{{%-?\s*set\s+{k}\s*=\s*{value}\b",
        rf"{k}\s*\|\s*default\(\s*{value}\s*\)",
    ]
    if value == "true":
        pats += [
            rf"{k}\s+is\s+defined\s+and\s+(?:not\s+{k}\b|{k}\s+is\s+false\b|{k}\s*==\s*false\b)",
            rf"{k}\s+is\s+not\s+defined\s+or\s+{k}\b",
            rf"\{{%-?\s*set\s+{k}\s*=\s*true\b",
        ]
    return [re.compile(p, re.IGNORECASE) for p in pats]


#: (toggle key, default value) -> patterns of templates that give the key that default
_DEFAULTS = {
    (key, value): _default_patterns(key, value)
    for key in ("enable_thinking", "thinking")
    for value in ("false", "true")
}


def _defaults_to(t: str, key: str, value: str) -> bool:
    return any(p.search(t) for p in _DEFAULTS[(key, value)])


def template_policy(chat_template: str | None) -> ReasoningPolicy | None:
    """What the chat template says about reasoning (fact sheet §4 step 2), or ``None``.

    ``always`` means the template itself opens reasoning (forced for every request).
    """
    t = chat_template or ""
    if not t:
        return None
    if all(s in t for s in ("<ifm|think>", "<ifm|think_fast>", "reasoning_effort")):
        return POLICIES["always"]
    if "<|channel|>" in t:
        return POLICIES["always"]
    if ("<|im_start|>assistant\\n<think>\\n" in t or "<|im_start|>assistant\n<think>\n" in t) \
            and "thinking" not in t:
        return POLICIES["always"]
    if _is_glm53(t):
        return POLICIES["always"]
    if "reasoning_effort" in t and "[THINK]" in t:
        return POLICIES["effort_given"]
    if all(s in t for s in ("reasoning_effort", "reasoning_mode_token", "no_think")):
        return POLICIES["effort_not_off"]
    if _defaults_to(t, "enable_thinking", "false"):
        return POLICIES["explicit_enable_thinking"]
    if "low_effort" in t and "truncate_history_thinking" in t:
        return POLICIES["enable_thinking"]
    if _defaults_to(t, "enable_thinking", "true"):
        return POLICIES["enable_thinking"]
    if _defaults_to(t, "thinking", "false"):
        return POLICIES["explicit_thinking"]
    if _defaults_to(t, "thinking", "true"):
        return POLICIES["thinking"]
    return None


def _is_glm53(t: str) -> bool:
    return (
        "[gMASK]<sop>" in t and "Reasoning Effort:" in t and "enable_thinking" not in t
        and all(s in t for s in ("<tool_call>", "<arg_key>", "<arg_value>"))
    )


def effective_policy(default: str, chat_template: str | None) -> ReasoningPolicy:
    """The policy of a parser whose ``reasoning_default`` is ``default``: the template's toggle
    configuration when it has one (§0.2), else the default. ``always`` from the template wins
    over any toggle (the template opens reasoning itself)."""
    return template_policy(chat_template) or POLICIES[default]


# --------------------------------------------------------------------------- factory


class ParserFactory:
    """Per-request factory of a reasoning parser class (the object plugins return).

    ``policy``: a :data:`POLICIES` name deciding ``force_reasoning`` per request, or ``None`` for
    parsers that take no such argument. With ``template_overrides`` the chat template's toggle
    configuration replaces it (§0.2); fixed overrides (always- or never-forced parsers, special
    serving-layer rules) pass ``template_overrides=False``.
    ``chat_template_kwargs.force_nonempty_content`` (a bool) sets the content swap; otherwise it
    is ``nonempty_default``, or on when ``nonempty_when_off`` and the request turned reasoning
    off with ``enable_thinking=false``. ``options["stream_reasoning"]=False`` buffers reasoning.
    """

    def __init__(
        self,
        name: str,
        cls: type[StreamingReasoningParser] = TagReasoningParser,
        *,
        policy: str | None = "enable_thinking",
        chat_template: str | None = None,
        options: dict[str, Any] | None = None,
        template_overrides: bool = True,
        nonempty_default: bool = False,
        nonempty_when_off: bool = False,
        **parser_kwargs: Any,
    ) -> None:
        self.name, self.cls = name, cls
        self.policy: ReasoningPolicy | None = None
        if policy is not None:
            self.policy = effective_policy(policy, chat_template) if template_overrides \
                else POLICIES[policy]
        self.stream_reasoning = bool((options or {}).get("stream_reasoning", True))
        self.nonempty_default = nonempty_default
        self.nonempty_when_off = nonempty_when_off
        self.parser_kwargs = parser_kwargs

    def __repr__(self) -> str:
        return f"ParserFactory({self.name!r}, {self.cls.__name__}, policy={self.policy})"

    def __call__(self, *, chat_template_kwargs: dict[str, Any] | None = None,
                 reasoning_effort: str | None = None) -> StreamingReasoningParser:
        kw = chat_template_kwargs if isinstance(chat_template_kwargs, dict) else {}
        extra = dict(self.parser_kwargs)
        if self.policy is not None:
            extra["force_reasoning"] = self.policy.enabled(kw, reasoning_effort)
        nonempty = self.nonempty_default or (
            self.nonempty_when_off and kw.get("enable_thinking") is False)
        return self.cls(
            stream_reasoning=self.stream_reasoning,
            force_nonempty_content=nonempty_requested(kw, nonempty),
            **extra,
        )


def nonempty_requested(chat_template_kwargs: dict[str, Any], default: bool) -> bool:
    """``chat_template_kwargs.force_nonempty_content`` when it is a bool, else ``default``."""
    value = chat_template_kwargs.get("force_nonempty_content")
    return value if isinstance(value, bool) else default
