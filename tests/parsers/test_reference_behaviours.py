"""Behaviours SGLang's parsers keep on its own parser test cases, held here with our own
fixtures: arguments always valid JSON, text around calls kept (never glued), control tokens
never in content, calls not lost, schemas followed, over-escaped values unescaped once, and a
continued (prefilled) message parsed from the state its prefill left.

Every case is checked whole and streamed one character at a time (the two must agree).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.parsers.api import MessageStream, assemble, parse_message
from reference_cases import both, calls


def tools(*names: str, props: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": props or {}}}} for n in names]


FORECAST = tools("forecast", "lookup", "clock", props={"place": {"type": "string"},
                                                         "hours": {"type": "integer"}})


# --------------------------------------------------------------------------- 1. valid JSON

@pytest.mark.parametrize("parser,text", [
    ("pythonic", "[forecast(place='Lima', hours=1e999)]"),
    ("lfm2", "<|tool_call_start|>[forecast(place='Lima', hours=1e999)]<|tool_call_end|>"),
    ("qwen25", '<tool_call>\n{"name": "forecast", "arguments": {"place": "Lima", "hours": 1e999}}'
               "\n</tool_call>"),
    ("glm45", "<tool_call>forecast\n<arg_key>place</arg_key>\n<arg_value>Lima</arg_value>\n"
              "<arg_key>hours</arg_key>\n<arg_value>1e999</arg_value>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=forecast>\n<parameter=place>\nLima\n</parameter>\n"
                    "<parameter=hours>\n1e999\n</parameter>\n</function>\n</tool_call>"),
    ("step3p5", "<tool_call>\n<function=forecast>\n<parameter=place>\nLima\n</parameter>\n"
                "<parameter=hours>\n1e999\n</parameter>\n</function>\n</tool_call>"),
    ("gemma4", '<|tool_call>call:forecast{place:<|"|>Lima<|"|>,hours:1e999}<tool_call|>'),
])
def test_a_number_beyond_float_range_keeps_its_text(parser, text):
    msg = both(text, tool_parser=parser, tools=FORECAST)
    assert calls(msg) == [("forecast", {"place": "Lima", "hours": "1e999"})]


def test_minus_infinity_in_a_pythonic_list_is_its_text_too():
    msg = both("[forecast(hours=-1e999), clock()]", tool_parser="pythonic", tools=FORECAST)
    assert calls(msg) == [("forecast", {"hours": "-1e999"}), ("clock", {})]


# --------------------------------------------------------------------------- 2. no glued words

@pytest.mark.parametrize("parser", ["qwen25", "hermes", "qwen"])
@pytest.mark.parametrize("before,after,content", [
    ("Checking now ", " then done", "Checking now then done"),
    ("Checking now\n", "then done", "Checking now\nthen done"),
    ("Checking now", "\tthen done", "Checking now\tthen done"),
    ("Checking now\n", "\n", "Checking now"),
    ("", "\nthen done", "then done"),
])
def test_text_around_a_call_keeps_its_separator(parser, before, after, content):
    call = '<tool_call>\n{"name": "lookup", "arguments": {"place": "Oslo"}}\n</tool_call>'
    msg = both(before + call + after, tool_parser=parser, tools=FORECAST)
    assert msg["content"] == content and calls(msg) == [("lookup", {"place": "Oslo"})]


def test_pythonic_keeps_the_text_around_its_list_verbatim():
    text = "Asking the service. [forecast(place='Mars')] After that, we report."
    msg = both(text, tool_parser="pythonic", tools=FORECAST)
    assert msg["content"] == "Asking the service.  After that, we report."
    wrapped = "Asking. <|python_start|>[clock()]<|python_end|> Done."
    assert both(wrapped, tool_parser="pythonic", tools=FORECAST)["content"] == "Asking.  Done."


def test_gemma4_keeps_words_apart():
    text = 'On it. <|tool_call>call:clock{}<tool_call|>\nResult soon.'
    assert both(text, tool_parser="gemma4", tools=FORECAST)["content"] == "On it.\nResult soon."


# --------------------------------------------------------------------------- 3. control tokens

def test_gigachat3_separator_before_a_spaced_call_header_is_not_content():
    text = ('Noted.<|message_sep|>\n\nfunction call<|role_sep|>\n'
            '{"name": "lookup", "arguments": {"place": "Rome"}}')
    msg = both(text, tool_parser="gigachat3", tools=FORECAST)
    assert msg["content"] == "Noted." and calls(msg) == [("lookup", {"place": "Rome"})]


@pytest.mark.parametrize("reasoning", [None, "inkling"])
def test_inkling_rejected_payload_leaves_no_framing(reasoning):
    text = "Hm <|message_model|>lookup<|content_invoke_tool_json|>{broken json<|end_message|> ok"
    msg = both(text, tool_parser="inkling", tools=FORECAST, reasoning_parser=reasoning)
    assert msg["tool_calls"] == [] and "<|" not in (msg["content"] or "")
    assert msg["content"].split() == ["Hm", "{broken", "json", "ok"]


# --------------------------------------------------------------------------- 4. lost calls

@pytest.mark.parametrize("reasoning", [None, "inkling"])
def test_inkling_block_without_a_header_is_a_call(reasoning):
    text = '<|content_invoke_tool_json|>{"name": "lookup", "args": {"place": "Kyiv"}}<|end_message|>'
    msg = both(text, tool_parser="inkling", tools=FORECAST, reasoning_parser=reasoning)
    assert calls(msg) == [("lookup", {"place": "Kyiv"})] and msg["content"] is None


def test_lfm2_recovers_string_values_holding_their_own_quotes():
    text = "<|tool_call_start|>[lookup(place='grep -n 'a,b' x.txt')]<|tool_call_end|>"
    assert calls(both(text, tool_parser="lfm2", tools=FORECAST)) == [
        ("lookup", {"place": "grep -n 'a,b' x.txt"})]
    two = "<|tool_call_start|>[clock(), forecast(place='it 's', hours=2)]<|tool_call_end|>"
    assert calls(both(two, tool_parser="lfm2", tools=FORECAST)) == [
        ("clock", {}), ("forecast", {"place": "it 's", "hours": 2})]


def test_dsml_self_closing_and_bare_invokes_are_calls():
    v4 = 'Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="clock"/>\n</｜DSML｜tool_calls>'
    msg = both(v4, tool_parser="deepseekv4", tools=FORECAST)
    assert msg["content"] == "Sure." and calls(msg) == [("clock", {})]
    bare = ('<｜DSML｜invoke name="lookup">\n<｜DSML｜parameter name="place" string="true">Nice'
            '</｜DSML｜parameter>\n</｜DSML｜invoke>')
    for parser in ("deepseekv32", "deepseekv4"):
        assert calls(both(bare, tool_parser=parser, tools=FORECAST)) == [
            ("lookup", {"place": "Nice"})]


# --------------------------------------------------------------------------- 5./6. values

ANY_OF = [{"type": "function", "function": {"name": "tally", "parameters": {"anyOf": [
    {"type": "object", "properties": {"n": {"type": "integer"}, "meta": {"type": "object"}}}]}}}]


@pytest.mark.parametrize("parser,text", [
    ("qwen3_coder", "<tool_call>\n<function=tally>\n<parameter=n>\n7\n</parameter>\n"
                    '<parameter=meta>\n{"k": [1]}\n</parameter>\n</function>\n</tool_call>'),
    ("glm47", '<tool_call>tally<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>meta'
              '</arg_key><arg_value>{"k": [1]}</arg_value></tool_call>'),
])
def test_types_declared_under_a_top_level_any_of_are_followed(parser, text):
    assert calls(both(text, tool_parser=parser, tools=ANY_OF)) == [
        ("tally", {"n": 7, "meta": {"k": [1]}})]


def test_over_escaped_json_value_is_unescaped_once():
    schema = [{"type": "function", "function": {"name": "tally", "parameters": {
        "type": "object", "properties": {"items": {"type": "array"}}}}}]
    raw = r'[{\"path\": \"D:\\\\data\", \"q\": \"say \\\"hi\\\"\"}]'
    text = f"<tool_call>tally<arg_key>items</arg_key><arg_value>{raw}</arg_value></tool_call>"
    assert calls(both(text, tool_parser="glm47", tools=schema)) == [
        ("tally", {"items": [{"path": "D:\\data", "q": 'say "hi"'}]})]


# --------------------------------------------------------------------------- 7. prefill

@pytest.mark.parametrize("reasoning", ["qwen3", "deepseek-r1", "qwen3-thinking", "glm45"])
def test_continuation_after_closed_reasoning_is_content(reasoning):
    prefill = "<think>add them</think>The sum is "
    msg = parse_message("12.", reasoning_parser=reasoning, prefill=prefill)
    assert (msg["reasoning_content"], msg["content"]) == (None, "12.")
    stream = MessageStream(reasoning_parser=reasoning, prefill=prefill)
    assert assemble([stream.feed("1"), stream.feed("2."), stream.finish()]) == msg


def test_continuation_inside_open_reasoning_stays_reasoning():
    msg = parse_message("more</think>12.", reasoning_parser="qwen3", prefill="<think>add ")
    assert (msg["reasoning_content"], msg["content"]) == ("more", "12.")


# --------------------------------------------------------------------------- reference details

def test_call_marker_inside_unclosed_reasoning_closes_it():
    text = ("<think>need data<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0"
            '<|tool_call_argument_begin|>{"place": "Bern"}<|tool_call_end|>'
            "<|tool_calls_section_end|>")
    msg = both(text, reasoning_parser="kimi_k2", tool_parser="kimi_k2", tools=FORECAST)
    assert msg["reasoning_content"] == "need data" and calls(msg) == [("lookup", {"place": "Bern"})]
    glm = "<think>need data<tool_call>clock\n</tool_call>"
    msg = both(glm, reasoning_parser="glm45", tool_parser="glm45", tools=FORECAST)
    assert msg["reasoning_content"] == "need data" and calls(msg) == [("clock", {})]


def test_a_stream_starts_the_call_when_its_marker_arrives_inside_reasoning():
    stream = MessageStream(reasoning_parser="kimi_k2", tool_parser="kimi_k2", tools=FORECAST)
    stream.feed("<think>need data")
    delta = stream.feed("<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0"
                        "<|tool_call_argument_begin|>{")
    assert delta["tool_calls"][0]["function"]["name"] == "lookup"


def test_unicode_arguments_are_not_ascii_escaped():
    text = '<tool_call>\n{"name": "lookup", "arguments": {"place": "杭州"}}\n</tool_call>'
    msg = both(text, tool_parser="qwen25", tools=FORECAST)
    assert "杭州" in msg["tool_calls"][0][1]


def test_brackets_inside_string_arguments_do_not_end_the_call():
    text = ('[TOOL_CALLS] [{"name": "lookup", "arguments": {"place": "[Town] - [Region]"}}]')
    assert calls(both(text, tool_parser="mistral", tools=FORECAST)) == [
        ("lookup", {"place": "[Town] - [Region]"})]


def test_text_after_llama3_call_stays_content():
    text = '{"name": "clock", "parameters": {}} and a follow-up remark'
    msg = both(text, tool_parser="llama3", tools=FORECAST)
    assert calls(msg) == [("clock", {})] and "follow-up" in msg["content"]


def test_undeclared_tool_stays_content():
    """Deliberate difference: SGLang drops such a call (unless told to forward it); here its
    text is returned as content, so nothing the model wrote is lost."""
    text = '<tool_call>\n{"name": "nowhere", "arguments": {}}\n</tool_call>'
    msg = both(text, tool_parser="qwen25", tools=FORECAST)
    assert msg["tool_calls"] == [] and msg["content"] == text
