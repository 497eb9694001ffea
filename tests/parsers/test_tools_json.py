"""JSON-family tool-call plugins: fact-sheet examples, generated cases, streaming equivalence."""

from __future__ import annotations

import json
import random
from functools import lru_cache

import pytest

from engine.parsers.base import ToolDelta, ToolResult
from engine.assembly import parser_factory

from json_tool_cases import (
    FACT_SHEET,
    EARLY_NAME,
    INCREMENTAL,
    MALFORMED,
    ONE,
    RICH,
    TOOLS,
    TWO,
    UNKNOWN,
    WIRE,
    plugin_of,
)

OWNED = (
    "auto", "apertus2509", "cohere_command4", "deepseekv3", "deepseekv31", "gpt-oss", "kimi_k2",
    "kimi_k3", "lfm2", "llama3", "mistral", "pythonic", "qwen", "qwen25", "trinity", "interns1",
    "hermes", "gigachat3", "gemma4", "inkling",
)


@lru_cache(maxsize=None)
def factory(name: str, chat_template: str | None = None):
    return parser_factory("tool_parser", name, chat_template=chat_template)


def parse(name: str, text: str, tools=TOOLS) -> ToolResult:
    return factory(name)(tools=tools).parse(text)


def stream(name: str, chunks, tools=TOOLS) -> tuple[ToolResult, list[ToolDelta]]:
    p = factory(name)(tools=tools)
    deltas = [p.feed(c) for c in chunks] + [p.finish()]
    content, calls = "", {}
    for d in deltas:
        content += d.content
        for c in d.calls:
            if c.index not in calls:
                assert c.name is not None and c.index == len(calls)
                calls[c.index] = [c.name, ""]
            else:
                assert c.name is None
            calls[c.index][1] += c.arguments
    res = ToolResult(content=content)
    res.calls = [type("C", (), {"name": n, "arguments": a})() for n, a in calls.values()]
    return res, deltas


def flat(r: ToolResult):
    return r.content, [(c.name, c.arguments) for c in r.calls]


def semantic(r: ToolResult):
    return r.content.strip(), [(c.name, json.loads(c.arguments)) for c in r.calls]


def assert_streams_like_whole(name: str, text: str, tools=TOOLS) -> ToolResult:
    whole = parse(name, text, tools)
    for c in whole.calls:
        assert isinstance(json.loads(c.arguments), dict)
        assert c.arguments == json.dumps(json.loads(c.arguments), ensure_ascii=False)
    splits = [[text[:i], text[i:]] for i in range(0, len(text) + 1, max(1, len(text) // 60))]
    rng = random.Random(len(text))
    for _ in range(8):
        chunks, i = [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            chunks.append(text[i : i + n])
            i += n
        splits.append(chunks)
    splits.append(list(text))
    for chunks in splits:
        got, _ = stream(name, chunks, tools)
        assert flat(got) == flat(whole), chunks
    return whole


def test_every_owned_name_is_installed():
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="engine.tool_parser")}
    assert set(OWNED) <= names


@pytest.mark.parametrize("name,text,content,calls", FACT_SHEET,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FACT_SHEET)])
def test_fact_sheet_examples(name, text, content, calls):
    whole = assert_streams_like_whole(name, text)
    assert semantic(whole) == (content, calls)


CASES = [(k, case) for k in WIRE for case in ("one", "two", "rich", "text_before", "unknown")]


@pytest.mark.parametrize("key,case", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_generated(key, case):
    name, wire = plugin_of(key), WIRE[key]
    calls = {"one": ONE, "two": TWO, "rich": RICH, "text_before": ONE, "unknown": UNKNOWN}[case]
    text = wire(calls)
    if case == "text_before":
        text = "Let me check that for you.\n\n" + text
    whole = assert_streams_like_whole(name, text)
    content, got = semantic(whole)
    if case == "unknown":
        assert got == [] and "unknown_tool" in content
        return
    if name == "gigachat3" and case == "two":  # one call per response: the second is text
        assert got == calls[:1] and "get_time" in content
        return
    assert got == calls
    assert content == ("Let me check that for you." if case == "text_before" else "")


@pytest.mark.parametrize("key", sorted(MALFORMED))
def test_malformed_call_falls_back_to_text(key):
    """No call, and the text stays content. Formats that stream the name before the arguments
    are complete have already emitted it when the malformation shows (documented asymmetry):
    streamed content still equals the whole parse, plus at most that one early name."""
    name, text = plugin_of(key), "Before. " + MALFORMED[key]
    whole = parse(name, text)
    assert whole.calls == []
    assert whole.content.startswith("Before. ") and len(whole.content) > len("Before. ") + 8
    for chunks in ([text], list(text), [text[i : i + 3] for i in range(0, len(text), 3)]):
        got, _ = stream(name, chunks)
        assert got.content == whole.content
        if name in EARLY_NAME:
            assert all(c.name == "get_weather" for c in got.calls) and len(got.calls) <= 1
        else:
            assert got.calls == []


@pytest.mark.parametrize("key", sorted(WIRE))
def test_no_declared_tools_means_no_calls(key):
    text = WIRE[key](TWO)
    for tools in ([], [{"type": "function", "function": {"name": "other"}}]):
        assert parse(plugin_of(key), text, tools).calls == []
        got, _ = stream(plugin_of(key), [text[i : i + 5] for i in range(0, len(text), 5)], tools)
        assert got.calls == []


@pytest.mark.parametrize("key", sorted(WIRE))
def test_unknown_call_between_known_ones_keeps_known(key):
    if plugin_of(key) == "gigachat3":
        pytest.skip("one call per response")
    text = WIRE[key]([ONE[0], UNKNOWN[0], TWO[1]])
    whole = assert_streams_like_whole(plugin_of(key), text)
    assert [c.name for c in whole.calls] == ["get_weather", "get_time"]
    assert "unknown_tool" in whole.content


@pytest.mark.parametrize("name", INCREMENTAL)
def test_incremental_formats_stream_name_before_the_end(name):
    key = "mistral" if name == "mistral" else name
    long_args = {"city": "x" * 200, "days": 3}
    text = WIRE[key]([("get_weather", long_args)])
    _, deltas = stream(name, [text[i : i + 4] for i in range(0, len(text), 4)])
    with_calls = [i for i, d in enumerate(deltas) if d.calls]
    assert deltas[with_calls[0]].calls[0].name == "get_weather"
    assert len(with_calls) > 10  # arguments arrive in many fragments
    assert with_calls[0] < len(deltas) - 30


# --------------------------------------------------------------------------- per-format details

DETAILS = [
    # (plugin, text, stripped content, calls)
    ("qwen25", 'A </tool_call> stray', "A  stray", []),
    ("qwen25", '<tool_call>{"name": "get_weather", "parameters": {"city": "</tool_call>"}}</tool_call>',
     "", [("get_weather", {"city": "</tool_call>"})]),
    ("qwen25", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "",
     [("get_weather", {"city": "Paris"})]),  # end tag missing at the end of the stream
    ("hermes", '<tool_call>  {"arguments": {"city": "Paris"}, "name": "get_weather"}  </tool_call>', "",
     [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', "",
     [("get_weather", {"city": "Paris"})]),
    ("trinity", "<think>just thinking</think>Answer.", "just thinkingAnswer.", []),
    ("llama3", 'Sure: {"name": "get_weather", "parameters": {}}', 'Sure: {"name": "get_weather", "parameters": {}}', []),
    ("llama3", '  {"name": "get_weather", "arguments": {"city": "Paris"}} trailing', "trailing",
     [("get_weather", {"city": "Paris"})]),
    ("mistral", 'Hi [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} bye', "Hi bye",
     [("get_weather", {"city": "Paris"})]),
    ("pythonic", "See [1] and [note] or [x](y).", "See [1] and [note] or [x](y).", []),
    ("pythonic", "[get_weather(city=__import__('os').getcwd())]", "[get_weather(city=__import__('os').getcwd())]", []),
    ("pythonic", "[get_weather(city='Paris', days=True, extra=None, deep={'a': (1, -2.5)})]", "",
     [("get_weather", {"city": "Paris", "days": True, "extra": None, "deep": {"a": [1, -2.5]}})]),
    ("lfm2", '<|tool_call_start|>[get_weather(city="a\nb", days=07, from="x", ok=true)]<|tool_call_end|>', "",
     [("get_weather", {"city": "a\nb", "days": 7, "from": "x", "ok": True})]),
    ("deepseekv3", "Checking.\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>",
     "Checking.", [("get_time", {})]),  # section end missing at the end of the stream
    ("kimi_k2", '<|tool_calls_section_begin|><|tool_call_begin|>get_time:3<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|> ok',
     "ok", [("get_time", {})]),
    ("kimi_k3", '<|open|>tools<|sep|><|open|>call tool="get_weather"<|sep|><|open|>argument key="city" type="string"<|sep|>a &amp; "b"<|close|>argument<|sep|><|open|>argument key="days" type="integer"<|sep|>x<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
     "", [("get_weather", {"city": 'a &amp; "b"', "days": "x"})]),
    ("gpt-oss", "<|channel|>commentary to=functions.get_time<|message|><|call|>", "", [("get_time", {})]),
    ("gpt-oss", "Plain answer without Harmony.", "Plain answer without Harmony.", []),
    ("gpt-oss", "<|start|>assistant<|channel|>commentary to=browser.search<|message|>{}<|call|>",
     "<|start|>assistant<|channel|>commentary to=browser.search<|message|>{}<|call|>", []),
    ("gemma4", '<|tool_call>call:get_weather{city:Paris,opts:{deep:[1,2.5,<|"|>a, b<|"|>]},ok:false}<tool_call|>', "",
     [("get_weather", {"city": "Paris", "opts": {"deep": [1, 2.5, "a, b"]}, "ok": False})]),
    ("apertus2509", 'A<|tools_prefix|>[{"get_time": {}}]<|tools_suffix|>B<|tools_prefix|>[{"get_weather": {}}]<|tools_suffix|>',
     "AB", [("get_time", {}), ("get_weather", {})]),
    ("cohere_command4", '<|START_ACTION|>[{"tool_name": "get_time", "parameters": {"tz": "CET"}}, {"tool_name": "get_w',
     ', {"tool_name": "get_w', [("get_time", {"tz": "CET"})]),  # a truncated array keeps its complete calls
    ("interns1", '<|action_start|><|plugin|>{"name": "get_time", "arguments": {}}<|action_end|>', "",
     [("get_time", {})]),
    ("gigachat3", 'Hi<|message_sep|>not a call', "Hi<|message_sep|>not a call", []),
    ("inkling", "<|message_model|><|content_text|>Answer<|end_message|><|content_model_end_sampling|>",
     "Answer", []),
]


@pytest.mark.parametrize("name,text,content,calls", DETAILS, ids=[f"{d[0]}-{i}" for i, d in enumerate(DETAILS)])
def test_format_details(name, text, content, calls):
    whole = assert_streams_like_whole(name, text)
    assert semantic(whole) == (content, calls)


def test_documented_asymmetry_of_incremental_streaming():
    """A truncated incremental call: streaming has emitted its name, ``parse`` has no call;
    both return the call's text as content (see the toolkit docstring), without the
    ``<tool_call>`` token (framing, never content)."""
    text = 'Hi <tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    whole = parse("hermes", text)
    assert whole.calls == [] and whole.content == text.replace("<tool_call>", "")
    got, _ = stream("hermes", [text[i : i + 4] for i in range(0, len(text), 4)])
    assert [c.name for c in got.calls] == ["get_weather"]
    assert got.content == whole.content


def test_gigachat3_only_one_call_per_response():
    text = WIRE["gigachat3"](TWO)
    whole = assert_streams_like_whole("gigachat3", text)
    assert [c.name for c in whole.calls] == ["get_weather"]
