"""Behaviour shared by every XML-parameter tool parser, driven by per-format encoders.

For each name: one call, two calls, complex arguments (nested object, array, unicode, quotes,
typed int/number/bool, a numeric-looking string), text before a call, a malformed call, an
unknown tool, an unterminated call; then streaming equals parsing for every split.
"""

from __future__ import annotations

import time

import pytest

from xml_tool_cases import (
    COMPLEX,
    COMPLEX_OVERRIDES,
    FORMATS,
    NAMES,
    ONE,
    TWO,
    UNKNOWN,
    arguments,
    make,
    parsed,
    splits,
    stream,
)


def complex_calls(name: str):
    (tool_name, args), = COMPLEX
    return [(tool_name, {**args, **COMPLEX_OVERRIDES.get(name, {})})]


def expect(name, calls):
    return [(n, arguments(name, a)) for n, a in calls]


def texts(name: str) -> dict[str, str]:
    enc, malformed = FORMATS[name]
    one = enc(ONE)
    return {
        "one": one,
        "two": enc(TWO),
        "complex": enc(complex_calls(name)),
        "before": "Let me check.\n" + one,
        "around": "Let me check.\n" + one + "\nDone.",
        "malformed": "Hm. " + malformed,
        "unknown": enc(UNKNOWN),
        "unterminated": "So " + one[: len(one) * 2 // 3],
        "plain": "No tools needed < here > really.",
    }


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "case, calls",
    [("one", ONE), ("two", TWO), ("complex", None), ("before", ONE), ("around", ONE)],
)
def test_calls(name, case, calls):
    calls = complex_calls(name) if calls is None else calls
    content, got = parsed(make(name).parse(texts(name)[case]))
    assert got == expect(name, calls)
    assert content == {"before": "Let me check.", "around": "Let me check.\nDone."}.get(case, "")


@pytest.mark.parametrize("name", NAMES)
def test_plain_text_is_content(name):
    text = texts(name)["plain"]
    assert parsed(make(name).parse(text)) == (text, [])


#: formats whose markers are control tokens: a rejected block is content without them
FRAMING = {"dots": ("<dots_function_call>", "</dots_function_call>")}


def unframed(name: str, text: str) -> str:
    for marker in FRAMING.get(name, ()):
        text = text.replace(marker, "")
    return text


@pytest.mark.parametrize("name", NAMES)
def test_malformed_call_is_content(name):
    text = texts(name)["malformed"]
    expected = unframed(name, text)
    if name in FRAMING:  # the payload is trimmed where its markers were
        expected = "Hm. " + expected[len("Hm. "):].strip()
    assert parsed(make(name).parse(text)) == (expected, [])


@pytest.mark.parametrize("name", NAMES)
def test_unknown_tool(name):
    text = texts(name)["unknown"]
    content, calls = parsed(make(name).parse(text))
    assert calls == []
    # poolside_v1 drops calls to unknown tools silently (fact sheet); the others keep the text
    assert content == ("" if name == "poolside_v1" else text)


@pytest.mark.parametrize("name", NAMES)
def test_unterminated_call_is_content(name):
    text = texts(name)["unterminated"]
    assert parsed(make(name).parse(text)) == (unframed(name, text), [])


@pytest.mark.parametrize("name", NAMES)
def test_no_tools_means_no_calls(name):
    text = texts(name)["one"]
    content, calls = parsed(make(name, tools=[]).parse(text))
    assert calls == [] and content == ("" if name == "poolside_v1" else text)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", ["two", "complex", "around", "malformed", "unknown", "unterminated", "plain"])
def test_streaming_equals_parse(name, case):
    text = texts(name)[case]
    whole = parsed(make(name).parse(text))
    for chunks in splits(text, seed=len(text)):
        assert stream(make(name), chunks) == whole, chunks


@pytest.mark.parametrize("name", NAMES)
def test_streaming_cost_per_chunk(name):
    """~4,000 tokens with 8 calls, fed in 4-character chunks: well under 50 µs per chunk."""
    enc, _ = FORMATS[name]
    filler = "The quick brown fox jumps over the lazy dog; it was <fine> & calm. " * 28
    text = "".join(filler + "\n" + enc(TWO if i % 2 else complex_calls(name)) + "\n" for i in range(8))
    chunks = [text[i : i + 4] for i in range(0, len(text), 4)]
    parser = make(name)
    start = time.perf_counter()
    for chunk in chunks:
        parser.feed(chunk)
    parser.finish()
    per_chunk = (time.perf_counter() - start) / len(chunks)
    assert len(text) > 16000
    assert per_chunk < 50e-6, f"{per_chunk * 1e6:.1f} µs per chunk"


@pytest.mark.parametrize("name", NAMES)
def test_conformance_kit(name):
    from engine.assembly import parser_factory
    from engine.testing.tools import check

    enc, malformed = FORMATS[name]
    factory = parser_factory("tool_parser", name, chat_template=None)
    assert check(name, factory, samples=[enc(ONE), "Hi\n" + enc(TWO), malformed]) == []
