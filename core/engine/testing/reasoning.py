"""Conformance kit for reasoning-parser plugins: checks that hold for every format.

``check(name, factory)`` runs them without knowing the format's markers and returns failure
messages (empty: pass). ``factory`` is what the plugin's ``engine_create_reasoning_parser``
returned. The checks, for several request settings:

* building a parser works and it is a :class:`~engine.parsers.base.ReasoningParser`;
* ``parse``/``feed``/``finish`` never raise and return string fields, on plain, unicode, garbage
  and "marker soup" text (fragments of many formats' markers);
* streamed results equal the whole parse for a split at every position, for one-character
  chunks and for random 1-8 character chunks (a parser may allow a documented asymmetry by
  providing ``stream_matches(whole, streamed) -> bool``);
* plain text (no markup) loses nothing: it appears in ``reasoning + content``;
* an empty stream yields nothing, and empty chunks yield nothing.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from engine.parsers.base import ReasoningDelta, ReasoningParser

REQUESTS: tuple[tuple[dict[str, Any], str | None], ...] = (
    ({}, None),
    ({"enable_thinking": False, "thinking": False}, None),
    ({"enable_thinking": True, "thinking": True, "thinking_mode": "enabled"}, "high"),
    ({"force_nonempty_content": True}, "low"),
)

PLAIN = (
    "The answer is 42. Nothing special here, just words and digits 1 2 3.",
    "First line\nsecond line\n\nthird line with tabs\tand  spaces ",
    "Unicode: héllo wörld, 你好, 😀 emoji, Ωμέγα,｜fullwidth｜ and ▁ blocks.",
)

FRAGMENTS = (
    "<think>", "</think>", "<think:x>", "<tool_call>", "</tool_call>", "<|", "|>", "<", ">", "/",
    "<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>", "analysis",
    "final", " to=functions.f", " to=self", " to=user", "<|eom|>", "<|eot|>", "[THINK]",
    "[/THINK]", "◁think▷", "◁/think▷", "<mm:think>", "</mm:think>", "<|channel>thought\n",
    "<channel|>", "<|open|>", "<|close|>", "think<|sep|>", "response<|sep|>", "tools<|sep|>",
    "<|START_THINKING|>", "<|END_THINKING|>", "<|START_TEXT|>", "<|END_TEXT|>",
    "<|START_ACTION|>", "<|inner_prefix|>", "<|inner_suffix|>", "<|tools_prefix|>",
    "<|tools_suffix|>", "<|message_model|>", "<|content_thinking|>", "<|content_text|>",
    "<|end_message|>", "<|content_invoke_tool_json|>", "<ifm|think>", "</ifm|think_fast>",
    "<ifm|tool_call>", "<｜DSML｜", "<|tool_calls_section_begin|>", "{\"a\": 1}", "\n", " ",
    "text", "é", "😀",
)


def _corpus(seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    texts = ["", *PLAIN]
    for _ in range(6):
        texts.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(4, 16))))
    alphabet = "<>|/[]{}:=_ abcz\n▷◁｜é😀\x00"
    for _ in range(3):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(10, 60))))
    return texts


def _chunkings(text: str, rng: random.Random) -> list[list[str]]:
    ways = [[text[:i], text[i:]] for i in range(1, len(text))]
    ways.append(list(text))
    for _ in range(3):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            pieces.append(text[i:i + n])
            i += n
        ways.append(pieces)
    return ways


def _stream(parser: ReasoningParser, chunks: list[str]) -> ReasoningDelta:
    r: list[str] = []
    c: list[str] = []
    for d in [*(parser.feed(ch) for ch in chunks), parser.finish()]:
        _typecheck(d)
        r.append(d.reasoning)
        c.append(d.content)
    return ReasoningDelta("".join(r), "".join(c))


def _typecheck(d: Any) -> None:
    if not isinstance(d, ReasoningDelta) or not isinstance(d.reasoning, str) \
            or not isinstance(d.content, str):
        raise TypeError(f"expected a ReasoningDelta of strings, got {d!r}")


def check(name: str, factory: Callable[..., ReasoningParser]) -> list[str]:
    """Run the generic checks on one reasoning-parser factory; return failure messages."""
    failures: list[str] = []
    rng = random.Random(7)
    corpus = _corpus()
    for kwargs, effort in REQUESTS:
        where = f"{name} (chat_template_kwargs={kwargs}, reasoning_effort={effort!r})"

        def make() -> ReasoningParser:
            return factory(chat_template_kwargs=dict(kwargs), reasoning_effort=effort)

        try:
            probe = make()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            failures.append(f"{where}: factory raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(probe, ReasoningParser):
            failures.append(f"{where}: factory returned {type(probe).__name__}, "
                            "not a ReasoningParser")
            continue
        empty = _run(lambda: _stream(make(), []), where, "empty stream", failures)
        if empty is not None and empty:
            failures.append(f"{where}: finish() after no input returned {empty!r}")
        mid = make()
        mid.feed("x")
        empty_chunk = _run(lambda: mid.feed(""), where, "feed('')", failures)
        if empty_chunk is not None and empty_chunk:
            failures.append(f"{where}: feed('') returned {empty_chunk!r}")
        for text in corpus:
            _check_text(make, text, rng, where, failures)
        if len(failures) > 20:
            break
    return failures


def _check_text(make: Callable[[], ReasoningParser], text: str, rng: random.Random,
                where: str, failures: list[str]) -> None:
    parser = make()
    whole = _run(lambda: parser.parse(text), where, f"parse({text!r})", failures)
    if whole is None:
        return
    if text in PLAIN and text not in whole.reasoning + whole.content:
        failures.append(f"{where}: plain text lost: {text!r} -> {whole!r}")
    for chunks in _chunkings(text, rng):
        streamer = make()
        got = _run(lambda: _stream(streamer, chunks), where, f"stream {chunks!r}", failures)
        if got is None:
            return
        matches = getattr(streamer, "stream_matches", None)
        ok = matches(whole, got) if callable(matches) else whole == got
        if not ok:
            failures.append(f"{where}: stream of {chunks!r} gave {got!r}, whole parse {whole!r}")
            return


def _run(fn: Callable[[], Any], where: str, what: str, failures: list[str]) -> Any:
    try:
        out = fn()
        if isinstance(out, ReasoningDelta):
            _typecheck(out)
        return out
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        failures.append(f"{where}: {what} raised {type(exc).__name__}: {exc}")
        return None
