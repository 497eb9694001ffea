"""Toolkit machinery (JSON streamers, canonical arguments, streaming base) and the auto plugin."""

from __future__ import annotations

import json
import random

import pytest

from engine.parsers.toolkit import (
    JsonCallStreamer,
    JsonStreamer,
    PairArgumentsStreamer,
    PassThroughToolParser,
    StreamingToolParser,
    TaggedBlockParser,
    dump_arguments,
    loads_object,
)
from engine.assembly import parser_factory

from json_tool_cases import TOOLS

# --------------------------------------------------------------------------- JSON streamer


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randint(0, 8 if depth < 3 else 4)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.randint(-10**6, 10**6)
    if kind == 2:
        return rng.choice([0.5, -1.25e-7, 3.0, 1e21, 123.456])
    if kind in (3, 4):
        return "".join(rng.choice('ab "\\/\n\t\x01é東😀\u2028') for _ in range(rng.randint(0, 12)))
    if kind in (5, 6):
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    suffixes = ("", "é", '"')
    return {f"k{i}{rng.choice(suffixes)}": _random_json(rng, depth + 1) for i in range(rng.randint(0, 4))}


def _feed_in_chunks(js: JsonStreamer, text: str, rng: random.Random) -> int:
    pos, stop, grown = 0, 0, [js.out]
    while stop < len(text):
        stop = min(len(text), stop + rng.randint(1, 6))
        pos = js.feed(text, pos, stop)
        assert js.out.startswith(grown[-1])  # the settled prefix only grows
        grown.append(js.out)
    return pos


@pytest.mark.parametrize("seed", range(40))
def test_json_streamer_matches_json_dumps(seed):
    rng = random.Random(seed)
    obj = {"root": _random_json(rng)}
    for compact in (False, True):
        for raw in (
            json.dumps(obj),
            json.dumps(obj, ensure_ascii=False, indent=rng.choice([None, 1, 2])),
            json.dumps(obj, separators=(",", ":")),
        ):
            js = JsonStreamer(compact=compact)
            end = _feed_in_chunks(js, raw + ' trailing', rng)
            assert js.done and end == len(raw)
            assert js.out == dump_arguments(json.loads(raw), compact)


def test_json_streamer_numbers_settle_when_they_end():
    js = JsonStreamer()
    js.feed('{"a": 12')
    assert js.out == '{"a": '
    js2 = JsonStreamer()
    js2.feed('{"a": 1.50E+2, "b": -0}')
    assert js2.out == '{"a": 150.0, "b": 0}'


def test_json_streamer_surrogate_pair_split_across_chunks():
    text = '{"e": "\\ud83d\\ude00"}'
    for cut in range(len(text) + 1):
        js = JsonStreamer()
        pos = js.feed(text, 0, cut)
        js.feed(text, pos)
        assert js.out == '{"e": "😀"}'


@pytest.mark.parametrize("bad", ['{"a" 1}', '{"a": 01}', '{"a": tru}', "[1]", '{"a": [1,]}',
                                 '{"a": "\\x"}', '{"a": NaN}', '{,}', '{"a": 1 "b": 2}', "nope"])
def test_json_streamer_rejects_invalid(bad):
    js = JsonStreamer()
    js.feed(bad)
    assert js.failed and not js.done


@pytest.mark.parametrize(
    "raw,name,args",
    [
        ('{"name": "f", "arguments": {"x": [1, {"y": null}]}}', "f", '{"x": [1, {"y": null}]}'),
        ('{"arguments": {"x": 1}, "name": "f"}', "f", '{"x": 1}'),
        ('{"name": "f", "parameters": {}}', "f", "{}"),
        ('{"name": "f"}', "f", "{}"),
        ('{"name": "f", "arguments": "{\\"x\\": 1}"}', "f", '{"x": 1}'),
        ('{"name": "f", "arguments": {"a": 1}, "parameters": {"b": 2}}', "f", '{"a": 1}'),
    ],
)
def test_json_call_streamer(raw, name, args):
    js = JsonCallStreamer()
    js.feed(raw)
    assert js.done and not js.invalid and (js.name, js.arguments) == (name, args)


@pytest.mark.parametrize("raw", ['{"name": 1, "arguments": {}}', '{"name": "f", "arguments": [1]}',
                                 '{"name": "f", "arguments": "not json"}'])
def test_json_call_streamer_invalid(raw):
    js = JsonCallStreamer()
    js.feed(raw)
    assert js.invalid


def test_json_call_streamer_streams_arguments_before_done():
    js = JsonCallStreamer()
    js.feed('{"name": "f", "arguments": {"city": "Par')
    assert js.name == "f" and js.arguments == '{"city": "Par' and not js.done


def test_pair_arguments_streamer():
    p = PairArgumentsStreamer()
    parts = [p.add("a", 1), p.key("b"), p.string('x"'), p.string("é\n"), p.end_string(),
             p.add("c", {"k": [1, None]}), p.close()]
    assert "".join(parts) == p.text == dump_arguments({"a": 1, "b": 'x"é\n', "c": {"k": [1, None]}})
    q = PairArgumentsStreamer(compact=True)
    q.add("a", [1, 2])
    q.key("s")
    q.end_string()
    q.close()
    assert q.text == '{"a":[1,2],"s":""}'
    assert PairArgumentsStreamer().close() == "{}"


def test_dump_arguments_and_loads_object():
    assert dump_arguments({"a": "é", "b": [1, 2]}) == '{"a": "é", "b": [1, 2]}'
    assert dump_arguments({"a": "é", "b": [1, 2]}, compact=True) == '{"a":"é","b":[1,2]}'
    assert loads_object('{"a": 1}') == {"a": 1}
    assert loads_object("[1]") is None and loads_object("{") is None


# --------------------------------------------------------------------------- streaming base


class Tagged(TaggedBlockParser):
    start_markers = ("<call>", "<call>>")
    end_marker = "</call>"
    drop_markers = ("</call>",)

    def parse_body(self, body):
        obj = loads_object(body)
        return [(obj.get("name"), obj.get("arguments", {}))] if obj else None


def _run(text, chunks=None):
    p = Tagged(tools=TOOLS)
    if chunks is None:
        r = p.parse(text)
        return r.content, [(c.name, c.arguments) for c in r.calls]
    content, calls = "", []
    for c in chunks + [None]:
        d = p.feed(c) if c is not None else p.finish()
        content += d.content
        calls += [(x.name, x.arguments) for x in d.calls]
    return content, calls


CALL = '<call>{"name": "get_time", "arguments": {"tz": "CET"}}</call>'


@pytest.mark.parametrize(
    "text,content",
    [
        ("Sure.\n" + CALL + "\n", "Sure."),
        ("Hi " + CALL + " bye", "Hi bye"),
        ("Hi\n" + CALL + "bye", "Hi\nbye"),
        ("Hi " + CALL + CALL + "\tbye", "Hi\tbye"),
        (CALL + "\n\n" + CALL + "\n\nDone.", "Done."),
        ("a </call> b", "a  b"),
        ("plain\n\n  ", "plain\n\n  "),
        ("x <call>bad</call> y", "x <call>bad</call> y"),
        ("x <call>{} y", "x <call>{} y"),
        ('<call>{"name": "nope"}</call>', '<call>{"name": "nope"}</call>'),
        ("ends with <cal", "ends with <cal"),
    ],
)
def test_base_content_rules(text, content):
    whole = _run(text)
    assert whole[0] == content
    for i in range(len(text) + 1):
        assert _run(text, [text[:i], text[i:]]) == whole


def test_join_with_whitespace_false_glues_the_content():
    class Glued(Tagged):
        join_with_whitespace = False

    for text, content in (("Hi " + CALL + " bye", "Hibye"), (CALL + " bye", "bye"),
                          ("Hi " + CALL + " \n" + CALL + "\n", "Hi")):
        for i in range(len(text) + 1):
            p = Glued(tools=TOOLS)
            got = p.feed(text[:i]).content + p.feed(text[i:]).content + p.finish().content
            assert got == content == Glued(tools=TOOLS).parse(text).content


def test_base_holds_partial_markers_and_waits_for_longer_marker():
    p = Tagged(tools=TOOLS)
    assert p.feed("abc <ca").content == "abc"
    assert p.feed("ll").content == ""  # "<call" may still become "<call>" or "<call>>"
    d = p.feed('>{"name": "get_time"}</call>')
    assert d.content == "" and d.calls[0].name == "get_time"


def test_pass_through():
    p = PassThroughToolParser(tools=TOOLS)
    assert p.feed("a<tool_call>").content == "a<tool_call>" and not p.finish()
    assert PassThroughToolParser().parse("x").content == "x"


def test_subclass_must_implement_advance():
    class Incomplete(StreamingToolParser):
        pass

    with pytest.raises(TypeError):
        Incomplete()


# --------------------------------------------------------------------------- auto

QWEN3_TEMPLATE = (
    "{%- if tools %}<tools>{% endif %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}"
)


@pytest.mark.parametrize(
    "template,expected",
    [
        ("{{ '<|tool_calls_section_begin|>' }}", "kimi_k2"),
        ("<|channel|>final<|message|>", "gpt-oss"),
        ("{{'<|channel>'}}", "gemma4"),
        ("<|inner_prefix|>", "apertus2509"),
        ("<｜tool▁calls▁begin｜><｜tool▁sep｜>", "deepseekv31"),
        ("<｜DSML｜ calls>", "deepseekv41"),
        ("<|tool_call_start|>x<|tool_call_end|>", "lfm2"),
        ("<minimax:tool_call>", "minimax-m2"),
        ("reasoning_effort [THINK]", "mistral"),
        ("<function=x><parameter=y>", "qwen3_coder"),
        (QWEN3_TEMPLATE, "qwen"),
        ("{% if not thinking is defined %}{% set thinking = false %}{% endif %}", "deepseekv3"),
        ("{% if not enable_thinking is defined %}{% set enable_thinking = false %}{% endif %}", "mimo"),
        ("<arg_key>k</arg_key><arg_value>v</arg_value>", "glm45"),
        ("Hello {{ messages }}", None),
        ("", None),
    ],
)
def test_auto_detection(template, expected):
    from engine_tool_auto.detect import detect_tool_parser

    assert detect_tool_parser(template) == expected


def test_auto_delegates_to_the_detected_plugin():
    text = ('Hi<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0'
            '<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|><|tool_calls_section_end|>')
    factory = parser_factory("tool_parser", "auto",
                           chat_template="{{ '<|tool_calls_section_begin|>' }}")
    r = factory(tools=TOOLS).parse(text)
    assert r.content == "Hi" and [(c.name, c.arguments) for c in r.calls] == [("get_time", '{"tz": "CET"}')]


@pytest.mark.parametrize("template", [None, "Hello {{ messages }}"])
def test_auto_without_a_detected_format_passes_text_through(template):
    factory = parser_factory("tool_parser", "auto", chat_template=template)
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    r = factory(tools=TOOLS).parse(text)
    assert r.content == text and r.calls == []
