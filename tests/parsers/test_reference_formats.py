"""Per-format behaviours that SGLang's own parser tests pin down, held here with our own
fixtures: Kimi K3 channel recovery and cut markers, DSML bare and self-closing invokes, JSON
payloads (arrays, Python dicts, positional arguments, rejected payloads), control tokens, XML
value typing and drifted close markers.

Every case is checked whole and streamed one character at a time (the two must agree), and
every call's arguments are strict JSON.
"""

from __future__ import annotations

from typing import Any

import pytest

from reference_cases import both, calls


def tools(*names: str, **props: str) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in props.items()}}
    return [{"type": "function", "function": {"name": n, "parameters": schema}} for n in names]


def split(msg: dict[str, Any]) -> tuple[str | None, str | None]:
    return msg["reasoning_content"], msg["content"]


# --------------------------------------------------------------------------- Kimi K3 (XTML)

THINK, END_THINK = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
REPLY, END_REPLY = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
END_MSG = "<|close|>message<|sep|>"
TOOLS, END_TOOLS = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
K3_TOOLS = tools("run", "ping", script="string", n="integer")


def k3_call(tool: str, *args: tuple[str, str, str], attrs: str = "") -> str:
    head = f'<|open|>call tool="{tool}"{attrs}<|sep|>' if tool else f"<|open|>call{attrs}<|sep|>"
    return head + "".join(f'<|open|>argument key="{k}" type="{t}"<|sep|>{v}<|close|>argument<|sep|>'
                          for k, t, v in args) + "<|close|>call<|sep|>"


def test_k3_think_close_missing_its_separator_still_closes_reasoning():
    text = f"weighing<|close|>think{REPLY}Go ahead.{END_REPLY}"
    assert split(both(text, reasoning_parser="kimi_k3")) == ("weighing", "Go ahead.")


@pytest.mark.parametrize("text,expected", [
    ("weighing<|close|>", ("weighing", None)),
    ("weighing<|close|>think", ("weighing", None)),
    (f"{END_THINK}<|open|>", (None, None)),
    (f"{END_THINK}<|open|>resp", (None, None)),
    (f"{END_THINK}{REPLY}Done here<|close|>response", (None, "Done here")),
    (f"{END_THINK}{REPLY}Done here{END_REPLY}<|close|>mess", (None, "Done here")),
    (f"{THINK}w{END_THINK}{REPLY}Done here{END_REPLY}<|open|>tools", ("w", "Done here")),
])
def test_k3_marker_cut_by_the_end_of_the_stream_is_dropped(text, expected):
    assert split(both(text, reasoning_parser="kimi_k3")) == expected


@pytest.mark.parametrize("tail", [" <3", " <", " <|", " <<x>>", " <not_a_marker>"])
def test_k3_angle_brackets_that_are_no_marker_stay(tail):
    text = f"{END_THINK}{REPLY}Done here{tail}"
    assert split(both(text, reasoning_parser="kimi_k3")) == (None, "Done here" + tail)


def test_k3_reply_closes_inside_reasoning_are_framing():
    text = f"Sunny and warm.{END_REPLY}{END_MSG}"
    assert split(both(text, reasoning_parser="kimi_k3")) == ("Sunny and warm.", None)


def test_k3_tools_channel_written_before_the_think_close_is_a_call():
    text = f"need data{TOOLS}{k3_call('ping')}{END_TOOLS}{END_THINK}{END_MSG}"
    msg = both(text, reasoning_parser="kimi_k3", tool_parser="kimi_k3", tools=K3_TOOLS)
    assert msg["reasoning_content"] == "need data" and msg["content"] is None
    assert calls(msg) == [("ping", {})]


def test_k3_tools_channel_without_its_close_keeps_complete_calls():
    text = TOOLS + k3_call("run", ("script", "string", "ls -la"))
    msg = both(text, tool_parser="kimi_k3", tools=K3_TOOLS)
    assert calls(msg) == [("run", {"script": "ls -la"})] and msg["content"] is None


@pytest.mark.parametrize("cut", [
    '<|open|>call tool="run"<|sep|>',
    '<|open|>call tool="ru',
    '<|open|>call tool="run"<|sep|><|open|>argument key="script" type="string"<|sep|>ls<|close|>ar',
    "<|open|>ca",
    "",
])
def test_k3_tools_channel_cut_by_the_end_leaves_no_framing(cut):
    msg = both("Running it. " + TOOLS + cut, tool_parser="kimi_k3", tools=K3_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"].strip() == "Running it."
    done = both(TOOLS + k3_call("ping") + cut, tool_parser="kimi_k3", tools=K3_TOOLS)
    assert calls(done) == [("ping", {})] and done["content"] is None


def test_k3_call_without_a_tool_attribute_is_skipped():
    text = TOOLS + k3_call("", attrs=' index="1"') + k3_call("ping") + END_TOOLS + END_MSG
    msg = both(text, tool_parser="kimi_k3", tools=K3_TOOLS)
    assert calls(msg) == [("ping", {})] and msg["content"] is None


@pytest.mark.parametrize("text,content", [
    ("All done<|open|>", "All done"),
    ("All done<|open|>tool", "All done"),
    ("All done<|close|>response", "All done"),
    ("All done<", "All done<"),
    ("3 < 4 and 5 |> 2", "3 < 4 and 5 |> 2"),
])
def test_k3_content_drops_cut_and_unseparated_markers(text, content):
    assert both(text, tool_parser="kimi_k3", tools=K3_TOOLS)["content"] == content


def test_k3_names_are_unescaped_string_values_are_raw():
    text = (TOOLS + '<|open|>call tool="a&amp;b"<|sep|>'
            '<|open|>argument key="q&quot;x" type="string"<|sep|>say &quot;hi&quot; <|sep'
            "<|close|>argument<|sep|><|close|>call<|sep|>" + END_TOOLS)
    assert calls(both(text, tool_parser="kimi_k3", tools=tools("a&b"))) == [
        ("a&b", {'q"x': "say &quot;hi&quot; <|sep"})]


# --------------------------------------------------------------------------- DSML V4.1

def test_dsml_v41_self_closing_and_bare_invokes_are_calls():
    d = "｜DSML｜"
    wrapped = f'Sure.\n\n<{d} calls>\n<{d} invoke name="ping"/>\n</{d} calls>'
    msg = both(wrapped, tool_parser="deepseekv41", tools=K3_TOOLS)
    assert msg["content"] == "Sure." and calls(msg) == [("ping", {})]
    bare = (f'Now <{d} invoke name="run">\n<{d} parameter name="script" string="true">make'
            f'</{d} parameter>\n</{d} invoke> and <{d} invoke name="ping"/> then')
    msg = both(bare, tool_parser="deepseekv41", tools=K3_TOOLS)
    assert calls(msg) == [("run", {"script": "make"}), ("ping", {})]
    assert msg["content"].split() == ["Now", "and", "then"]


# --------------------------------------------------------------------------- JSON payloads

WEATHER = tools("weather", "clock", city="string", unit="string")


@pytest.mark.parametrize("parser", ["qwen25", "hermes", "trinity"])
def test_tagged_array_payload_keeps_its_calls_and_skips_junk(parser):
    text = ('<tool_call>\n[{"name": "weather", "arguments": {"city": "Lima"}}, "junk", 3, '
            '{"name": "clock"}]\n</tool_call>')
    assert calls(both(text, tool_parser=parser, tools=WEATHER)) == [
        ("weather", {"city": "Lima"}), ("clock", {})]


@pytest.mark.parametrize("parser", ["qwen25", "hermes", "trinity"])
@pytest.mark.parametrize("payload", ["[1, 2]", '["x"]', "[null]", "[[]]", "not json at all"])
def test_unreadable_tagged_payload_is_content_without_its_tags(parser, payload):
    msg = both(f"Hm <tool_call>\n{payload}\n</tool_call> ok", tool_parser=parser, tools=WEATHER)
    assert msg["tool_calls"] == [] and "tool_call>" not in msg["content"]
    assert msg["content"].split() == ["Hm", *payload.split(), "ok"]


def test_call_without_arguments_is_an_empty_object_and_the_next_call_follows():
    text = ('<tool_call>\n{"name": "clock"}\n</tool_call>\n'
            '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    for parser in ("qwen25", "hermes"):
        assert calls(both(text, tool_parser=parser, tools=WEATHER)) == [
            ("clock", {}), ("weather", {"city": "Oslo"})]


def test_llama3_reads_python_dict_calls_among_json_ones():
    text = ("On it <|python_tag|>{'name': 'weather', 'arguments': {'city': 'Rome', 'unit': None}};"
            ' {"name": "clock", "parameters": {}} then more')
    msg = both(text, tool_parser="llama3", tools=WEATHER)
    assert calls(msg) == [("weather", {"city": "Rome", "unit": None}), ("clock", {})]
    assert msg["content"] == "On it then more"


def test_llama3_unfinished_python_dict_is_content():
    text = "{'name': 'clock', 'arguments': {}"
    msg = both(text, tool_parser="llama3", tools=WEATHER)
    assert msg["tool_calls"] == [] and msg["content"] == text


@pytest.mark.parametrize("parser,wrap", [("pythonic", "{}"),
                                         ("lfm2", "<|tool_call_start|>{}<|tool_call_end|>")])
def test_positional_arguments_take_the_declared_parameter_names(parser, wrap):
    """Deliberate difference: SGLang ignores positional arguments (the call has ``{}``); here
    they take the declared names in order, so the values are not lost."""
    text = wrap.format("[weather('Kyiv', unit='C'), clock('extra')]")
    declared = tools("weather", city="string", unit="string") + tools("clock")
    assert calls(both(text, tool_parser=parser, tools=declared)) == [
        ("weather", {"unit": "C", "city": "Kyiv"}), ("clock", {})]


@pytest.mark.parametrize("text", ["[weather(city=)]", "weather(city='Kyiv')",
                                  "[weather(city=open('x'))]"])
def test_pythonic_text_that_is_no_call_list_stays_content(text):
    msg = both(text, tool_parser="pythonic", tools=WEATHER)
    assert msg["tool_calls"] == [] and msg["content"] == text


def test_pythonic_brackets_inside_strings_do_not_end_the_list():
    assert calls(both('[weather(city="]", unit="[")]', tool_parser="pythonic",
                      tools=WEATHER)) == [("weather", {"city": "]", "unit": "["})]


def test_mistral_compact_form():
    msg = both('Let me see. [TOOL_CALLS]weather[ARGS]{"city": "Nice"}', tool_parser="mistral",
               tools=WEATHER)
    assert msg["content"] == "Let me see." and calls(msg) == [("weather", {"city": "Nice"})]


# --------------------------------------------------------------------------- Kimi K2 tokens

K2_TOOLS = tools("read-file", "mcp__docs__find-page", path="string")


def test_k2_hyphenated_names_and_conversation_level_indices():
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.read-file:7"
            '<|tool_call_argument_begin|>{"path": "/a"}<|tool_call_end|>'
            "<|tool_call_begin|>functions.mcp__docs__find-page:8"
            '<|tool_call_argument_begin|>{"path": "/b"}<|tool_call_end|><|tool_calls_section_end|>')
    assert calls(both(text, tool_parser="kimi_k2", tools=K2_TOOLS)) == [
        ("read-file", {"path": "/a"}), ("mcp__docs__find-page", {"path": "/b"})]


@pytest.mark.parametrize("text,content", [
    ("all clear<|tool_calls_section_end|>", "all clear"),
    ("before<|tool_call_argument_begin|> after", "before after"),
    ("spilled<|tool_calls_section_begin|><|tool_call_end|> words", "spilled words"),
    ("a trailing <", "a trailing <"),
])
def test_k2_stray_control_tokens_are_not_content(text, content):
    msg = both(text, tool_parser="kimi_k2", tools=K2_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"] == content


# --------------------------------------------------------------------------- XML values

GLM_TOOLS = tools("weather", "noop", city="string", count="number", filters="object")


def glm_call(*pairs: tuple[str, str]) -> str:
    return "<tool_call>weather\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs) + "</tool_call>"


@pytest.mark.parametrize("parser", ["glm45", "glm47"])
def test_glm_values_follow_the_schema(parser):
    text = glm_call(("city", "007"), ("count", '"42"'), ("filters", '{"a": [1]}'))
    assert calls(both(text, tool_parser=parser, tools=GLM_TOOLS)) == [
        ("weather", {"city": "007", "count": 42, "filters": {"a": [1]}})]
    odd = glm_call(("city", "C:\\Users\\me & a<b"), ("count", "2.5"))
    assert calls(both(odd, tool_parser=parser, tools=GLM_TOOLS)) == [
        ("weather", {"city": "C:\\Users\\me & a<b", "count": 2.5})]


def test_glm45_call_without_its_name_separator_is_no_call():
    msg = both("<tool_call>weather</tool_call>", tool_parser="glm45", tools=GLM_TOOLS)
    assert msg["tool_calls"] == []


QC_TOOLS = tools("weather", city="string", days="integer")


def qc_call(city_block: str) -> str:
    return ("<tool_call>\n<function=weather>\n<parameter=city>\n" + city_block
            + "\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


@pytest.mark.parametrize("parser", ["qwen3_coder", "step3p5"])
@pytest.mark.parametrize("drift", ["</parameter2>", "</parameter_city>", "</parameter"])
def test_drifted_close_marker_of_an_unclosed_value_is_dropped(parser, drift):
    msg = both(qc_call("Lyon\n" + drift), tool_parser=parser, tools=QC_TOOLS)
    assert calls(msg) == [("weather", {"city": "Lyon", "days": 3})]


@pytest.mark.parametrize("parser", ["qwen3_coder", "step3p5"])
@pytest.mark.parametrize("value", ["<cfg>\n  <p>1</p>\n</parameters>", "y </parameterSet>",
                                   "a <b>bold</b> town"])
def test_closed_value_keeps_text_that_looks_like_a_marker(parser, value):
    msg = both(qc_call(value + "\n</parameter>"), tool_parser=parser, tools=QC_TOOLS)
    assert calls(msg) == [("weather", {"city": value, "days": 3})]
