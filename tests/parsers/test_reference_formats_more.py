"""More per-format behaviours that SGLang's own parser tests pin down, held here with our own
fixtures: Harmony calls, Step-3 and Step-3.5 repairs, MiniMax M2/M3 value conversion, MiMo
values, Hunyuan HY4 calls, Cohere action blocks, dots blocks, Spark and IQuest values, Inkling
payloads, GigaChat, Poolside, GLM-4.7, LFM2 and Apertus details.

Every case is checked whole and streamed one character at a time (the two must agree), and
every call's arguments are strict JSON.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.parsers.api import parse_message
from reference_cases import both, calls


def tools(*names: str, **props: Any) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {
        k: ({"type": t} if isinstance(t, str) else t) for k, t in props.items()}}
    return [{"type": "function", "function": {"name": n, "parameters": schema}} for n in names]


def tool(name: str, parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": name, "parameters": parameters}}]


# --------------------------------------------------------------------------- gpt-oss (Harmony)

HARMONY_TOOLS = tools("lookup", "forecast", files="array", place="string", units="string")


def harmony(name: str, body: str, space: str = " ") -> str:
    return (f"<|start|>assistant<|channel|>commentary to=functions.{name}{space}"
            f"<|constrain|>json<|message|>{body}<|call|>")


def test_harmony_calls_follow_each_other_and_text_before_stays():
    text = ("One moment." + harmony("forecast", '{"place":"Quito"}', space="")
            + harmony("lookup", '{\n  "files": []\n}'))
    msg = both(text, tool_parser="gpt-oss", tools=HARMONY_TOOLS)
    assert msg["content"] == "One moment."
    assert calls(msg) == [("forecast", {"place": "Quito"}), ("lookup", {"files": []})]


def test_harmony_analysis_is_reasoning_and_a_final_after_the_call_is_kept():
    """Deliberate difference: SGLang drops normal text that follows a call; here the final
    channel written after it stays content."""
    text = ("<|channel|>analysis<|message|>Need the files.<|end|>" + harmony("lookup", "{}")
            + "<|start|>assistant<|channel|>final<|message|>Listed below.")
    msg = both(text, reasoning_parser="gpt-oss", tool_parser="gpt-oss", tools=HARMONY_TOOLS)
    assert msg["reasoning_content"] == "Need the files."
    assert calls(msg) == [("lookup", {})] and msg["content"] == "Listed below."


# --------------------------------------------------------------------------- Step-3

STEP_TOOLS = tools("forecast", place="string", days="integer") + tools("noop")


def step3(*blocks: str) -> str:
    return "<｜tool_calls_begin｜>" + "".join(blocks) + "<｜tool_calls_end｜>"


def step3_call(name: str, *params: tuple[str, str]) -> str:
    inner = "".join(f'<steptml:parameter name="{k}">{v}</steptml:parameter>' for k, v in params)
    return (f'<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{name}">{inner}'
            "</steptml:invoke><｜tool_call_end｜>")


def test_step3_calls_without_parameters_and_mixed_with_others():
    text = "Checking. " + step3(step3_call("noop"), step3_call("forecast", ("place", "Oslo")),
                                step3_call("forecast"), step3_call("noop"))
    msg = both(text, tool_parser="step3", tools=STEP_TOOLS)
    assert msg["content"] == "Checking."
    assert calls(msg) == [("noop", {}), ("forecast", {"place": "Oslo"}), ("forecast", {}),
                          ("noop", {})]


def test_step3_values_keep_angle_brackets_and_follow_the_schema():
    text = step3(step3_call("forecast", ("place", "if x < 3:\n  go(x)"), ("days", "7")))
    assert calls(both(text, tool_parser="step3", tools=STEP_TOOLS)) == [
        ("forecast", {"place": "if x < 3:\n  go(x)", "days": 7})]


# --------------------------------------------------------------------------- Step-3.5 repairs

SHELL = tools("shell", "forecast", cmd="string", opts="object", ids="array", wait="integer",
              place="string", region="string")
RUN = "<tool_call><function=shell><parameter=cmd>uptime</parameter></function></tool_call>"


@pytest.mark.parametrize("text", [
    "<tool_call><function shell><parameter=cmd>uptime</parameter></function></tool_call>",
    "<tool_call><functionshell><parameter=cmd>uptime</parameter></function></tool_call>",
    "<tool_call><function=shell\n<parameter=cmd\nuptime</parameter></function></tool_call>",
    "<tool_call><function=shell><parameter=parameter=cmd\nuptime</parameter></function>"
    "</tool_call>",
    "<tool_call><function=shell><parameter=cmd>uptime</tool_call>",
    "<function=shell><parameter=cmd>uptime</parameter></function>",
    "<function=shell><parameter=cmd>uptime</parameter></function></tool_call>",
    "<function=shell><parameter=cmd>uptime</parameter></function>\n  </tool_call>",
    "<tool_call><function=shell><parameter=cmd>uptime",
    "<tool_call><function=shell><parameter=cmd>uptime</param",
])
def test_step3p5_repairs_a_slightly_off_block(text):
    msg = both(text, tool_parser="step3p5", tools=SHELL)
    assert calls(msg) == [("shell", {"cmd": "uptime"})] and msg["content"] is None


def test_step3p5_a_value_may_end_at_the_next_parameter():
    text = ("<tool_call><function=forecast><parameter=place>Lyon<parameter=region>ARA"
            "</parameter></function></tool_call>")
    assert calls(both(text, tool_parser="step3p5", tools=SHELL)) == [
        ("forecast", {"place": "Lyon", "region": "ARA"})]


@pytest.mark.parametrize("text", [
    "<tool_call><functionshell><parameter=cmd>uptime</parameter></function></tool_call>",
    "<tool_call><function shell><parameter=cmd>uptime</parameter></function></tool_call>",
])
def test_qwen3_coder_does_not_gain_the_step3p5_repairs(text):
    assert both(text, tool_parser="qwen3_coder", tools=SHELL)["tool_calls"] == []


@pytest.mark.parametrize("text", [
    "<tool_call><function=shell",
    "<tool_call><function=shell><parameter=cmd",
    "<tool_call><function nowhere><parameter=cmd>uptime</parameter></function></tool_call>",
    "Mentions <functionality and <parameterization here",
    "a</function>b</parameter>c</tool_call>d",
    "before<function=nowhere><parameter=cmd>uptime</parameter></function>after",
])
def test_step3p5_text_that_is_no_call_stays_content(text):
    msg = both(text, tool_parser="step3p5", tools=SHELL)
    assert msg["tool_calls"] == [] and msg["content"] == text


def test_step3p5_keeps_complete_calls_and_the_text_between():
    second = RUN.replace("shell", "forecast").replace("cmd", "place").replace("uptime", "Nice")
    msg = both("go" + RUN + "then" + second + "<tool_call><function=forecast",
               tool_parser="step3p5", tools=SHELL)
    assert calls(msg) == [("shell", {"cmd": "uptime"}), ("forecast", {"place": "Nice"})]
    assert msg["content"] == "gothen<tool_call><function=forecast"
    prose = "see <functions>x</functions> and <</function>y"
    msg = both(prose + RUN, tool_parser="step3p5", tools=SHELL)
    assert msg["content"] == prose and calls(msg) == [("shell", {"cmd": "uptime"})]


def test_step3p5_values_holding_markers_and_python_literals():
    text = ("<tool_call><function=shell><parameter=cmd>echo '<function x>' '<tool_call>'"
            "</parameter><parameter=opts>{'dry': True}</parameter><parameter=ids>[4, 5]"
            "</parameter></function></tool_call>")
    assert calls(both(text, tool_parser="step3p5", tools=SHELL)) == [
        ("shell", {"cmd": "echo '<function x>' '<tool_call>'", "opts": {"dry": True},
                   "ids": [4, 5]})]


def test_step3p5_a_value_that_does_not_convert_keeps_its_text():
    """Deliberate difference: SGLang returns the whole block as content; here the call is kept
    and the value its text, as for any typed parameter that fails to convert."""
    text = ("<tool_call><function=shell><parameter=opts>{3, 4}</parameter></function>"
            "</tool_call>")
    assert calls(both(text, tool_parser="step3p5", tools=SHELL)) == [
        ("shell", {"opts": "{3, 4}"})]


# --------------------------------------------------------------------------- MiniMax-M2 values

def m2_call(name: str, **params: str) -> str:
    inner = "".join(f'\n<parameter name="{k}">{v}</parameter>' for k, v in params.items())
    return f'<minimax:tool_call>\n<invoke name="{name}">{inner}\n</invoke>\n</minimax:tool_call>'


M2_TOOLS = tools("tune", level="number", steps="integer", on="boolean", note="string",
                 maybe={"type": ["integer", "null"]}, pick={"enum": ["slow", 2, None]},
                 either={"oneOf": [{"type": "integer"}, {"type": "null"}]})


@pytest.mark.parametrize("params,expected", [
    ({"level": "4.0", "steps": "9"}, {"level": 4, "steps": 9}),
    ({"level": "0.25", "steps": "many"}, {"level": 0.25, "steps": "many"}),
    ({"on": "yes"}, {"on": True}), ({"on": "ON"}, {"on": True}), ({"on": "1"}, {"on": True}),
    ({"on": "no"}, {"on": False}), ({"on": "off"}, {"on": False}), ({"on": "0"}, {"on": False}),
    ({"note": "null"}, {"note": None}),
    ({"maybe": "none"}, {"maybe": None}), ({"maybe": "nil"}, {"maybe": None}),
    ({"maybe": "12"}, {"maybe": 12}), ({"either": "12"}, {"either": 12}),
    ({"pick": "slow"}, {"pick": "slow"}), ({"pick": "2"}, {"pick": 2}),
])
def test_minimax_m2_converts_values_as_sglang(params, expected):
    assert calls(both(m2_call("tune", **params), tool_parser="minimax-m2", tools=M2_TOOLS)) == [
        ("tune", expected)]


def test_minimax_m2_blocks_text_and_unfinished_block():
    text = "Tuning now. " + m2_call("tune", steps="1") + m2_call("tune", note="x")
    msg = both(text, tool_parser="minimax-m2", tools=M2_TOOLS)
    assert msg["content"] == "Tuning now."
    assert calls(msg) == [("tune", {"steps": 1}), ("tune", {"note": "x"})]
    cut = '<minimax:tool_call>\n<invoke name="tune">\n<parameter name="steps">3</parameter>'
    msg = both(cut, tool_parser="minimax-m2", tools=M2_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"] == cut


# --------------------------------------------------------------------------- MiniMax-M3

NS = "]<]minimax[>["


def m3(*pieces: str) -> str:
    return "".join(NS + p for p in pieces)


def m3_call(name: str, *pieces: str) -> str:
    return m3("<tool_call>", f'<invoke name="{name}">', *pieces, "</invoke>", "</tool_call>")


M3_TOOLS = (tools("memo", body="string", mode={"type": "string", "enum": ["none", "all"]},
                  opt={"type": ["string", "null"]})
            + tool("mix", {"type": "object", "oneOf": [
                {"type": "object",
                 "properties": {"n": {"type": "integer"}, "on": {"type": "boolean"}}},
                {"type": "object", "properties": {"kind": {"const": "x"}}}]}))


@pytest.mark.parametrize("value", ["keep this ", "keep this\n", "tab\t", "nbsp\u00a0",
                                   "\u3000wide\u3000", 'say "hi" \\ now\nnext'])
def test_minimax_m3_string_values_are_verbatim(value):
    msg = both(m3_call("memo", f"<body>{value}", "</body>"), tool_parser="minimax-m3",
               tools=M3_TOOLS)
    assert calls(msg) == [("memo", {"body": value})]


@pytest.mark.parametrize("tag,value,expected", [
    ("mode", "none", "none"), ("mode", "null", "null"), ("opt", "null", None),
    ("opt", "none", "none"),
])
def test_minimax_m3_null_only_where_the_schema_admits_it(tag, value, expected):
    msg = both(m3_call("memo", f"<{tag}>{value}", f"</{tag}>"), tool_parser="minimax-m3",
               tools=M3_TOOLS)
    assert calls(msg) == [("memo", {tag: expected})]


def test_minimax_m3_parameters_under_a_top_level_one_of_are_typed():
    msg = both(m3_call("mix", "<n>7", "</n>", "<on>true", "</on>"), tool_parser="minimax-m3",
               tools=M3_TOOLS)
    assert calls(msg) == [("mix", {"n": 7, "on": True})]


@pytest.mark.parametrize("text", [
    m3("<tool_call>", '<invoke name="memo">', "<body>cut"),
    m3_call("memo", "<body>x", "</other>"),
])
def test_minimax_m3_broken_block_is_content(text):
    msg = both(text, tool_parser="minimax-m3", tools=M3_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"] == text


# --------------------------------------------------------------------------- MiMo values

MIMO_TOOLS = tools("probe", s="string", i="integer", n="number", f="float", b="boolean",
                   o="object", u="uint32", l="long", t="tuple", free={"description": "x"})


def mimo(**params: str) -> str:
    inner = "".join(f"<parameter={k}>{v}</parameter>" for k, v in params.items())
    return f"<tool_call><function=probe>{inner}</function></tool_call>"


@pytest.mark.parametrize("params,expected", [
    ({"s": "null", "i": "NULL", "b": "Null"}, {"s": None, "i": None, "b": None}),
    ({"n": "6.0", "i": "-4", "f": "1.5"}, {"n": 6, "i": -4, "f": 1.5}),
    ({"n": "8", "i": "eight"}, {"n": 8, "i": "eight"}),
    ({"b": "TRUE", "n": "lots"}, {"b": True, "n": "lots"}),
    ({"o": "{'k': 'v'}", "u": "3", "l": "5"}, {"o": {"k": "v"}, "u": 3, "l": 5}),
    ({"o": "{broken", "t": "(1, 2)"}, {"o": "{broken", "t": [1, 2]}),
    ({"free": "12"}, {"free": "12"}),
])
def test_mimo_values_follow_the_schema(params, expected):
    assert calls(both(mimo(**params), tool_parser="mimo", tools=MIMO_TOOLS)) == [
        ("probe", expected)]


def test_mimo_boolean_word_that_is_not_true_or_false_keeps_its_text():
    """Deliberate difference: SGLang turns any other word into ``false``."""
    assert calls(both(mimo(b="yes"), tool_parser="mimo", tools=MIMO_TOOLS)) == [
        ("probe", {"b": "yes"})]


def test_mimo_block_without_a_function_is_content():
    text = "<tool_call>nothing callable</tool_call>"
    msg = both(text, tool_parser="mimo", tools=MIMO_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"] == text


# --------------------------------------------------------------------------- Hunyuan

HY_TOOLS = tools("forecast", place="string", days="integer") + tool("now", {})
HY4_TEMPLATE = ("{{ '<tool_calls:opensource><tool_call:opensource><arg_key:opensource>"
                "</arg_key:opensource><arg_value:opensource></arg_value:opensource>"
                "</tool_call:opensource></tool_calls:opensource>' }}")


def test_hunyuan_hy4_call_without_a_separator():
    text = ("<tool_calls:opensource><tool_call:opensource>forecast<arg_key:opensource>place"
            "</arg_key:opensource><arg_value:opensource>Bern</arg_value:opensource>"
            "</tool_call:opensource><tool_call:opensource>now</tool_call:opensource>"
            "</tool_calls:opensource>")
    msg = both(text, tool_parser="hunyuan", tools=HY_TOOLS, chat_template=HY4_TEMPLATE)
    assert calls(msg) == [("forecast", {"place": "Bern"}), ("now", {})]


def test_hunyuan_unknown_call_among_known_ones_stays_content():
    text = ("<tool_calls><tool_call>now<tool_sep></tool_call><tool_call>ghost<tool_sep>"
            "</tool_call><tool_call>forecast<tool_sep><arg_key>days</arg_key><arg_value>2"
            "</arg_value></tool_call></tool_calls>")
    msg = both(text, tool_parser="hunyuan", tools=HY_TOOLS)
    assert calls(msg) == [("now", {}), ("forecast", {"days": 2})]
    assert msg["content"] == "<tool_call>ghost<tool_sep></tool_call>"


@pytest.mark.parametrize("word,schema,raw,expected", [
    ("anyOf", {"type": "integer"}, "7", 7), ("oneOf", {"type": "boolean"}, "true", True),
    ("allOf", {"type": "array"}, "[1,2]", [1, 2]),
])
def test_hunyuan_types_under_a_top_level_composition(word, schema, raw, expected):
    declared = tool("f", {word: [{"type": "object", "properties": {"v": schema}}]})
    text = (f"<tool_calls><tool_call>f<tool_sep><arg_key>v</arg_key><arg_value>{raw}"
            "</arg_value></tool_call></tool_calls>")
    assert calls(both(text, tool_parser="hunyuan", tools=declared)) == [("f", {"v": expected})]


# --------------------------------------------------------------------------- Cohere actions

COHERE_TOOLS = tools("forecast", "search", place="string", q="string")


def action(name: str, **params: str) -> str:
    return json.dumps({"tool_call_id": "0", "tool_name": name, "parameters": params})


def test_cohere_body_may_be_one_object_without_the_array():
    text = "Sure. <|START_ACTION|>" + action("search", q="maps") + "<|END_ACTION|>"
    msg = both(text, tool_parser="cohere_command4", tools=COHERE_TOOLS)
    assert msg["content"] == "Sure." and calls(msg) == [("search", {"q": "maps"})]


@pytest.mark.parametrize("payload", ["[not valid json", "[7, \"x\", null]"])
def test_cohere_unreadable_body_is_content_without_its_tokens(payload):
    msg = both(f"first <|START_ACTION|>{payload}<|END_ACTION|> last",
               tool_parser="cohere_command4", tools=COHERE_TOOLS)
    assert msg["tool_calls"] == [] and "ACTION" not in msg["content"]
    assert msg["content"].split() == ["first", *payload.split(), "last"]


def test_cohere_parallel_actions_and_text_after():
    text = ("On it.<|START_ACTION|>[" + action("forecast", place="Rome") + ", "
            + action("search", q="ramen") + "]<|END_ACTION|>All set.")
    msg = both(text, tool_parser="cohere_command4", tools=COHERE_TOOLS)
    assert calls(msg) == [("forecast", {"place": "Rome"}), ("search", {"q": "ramen"})]
    assert msg["content"] == "On it.All set."


# --------------------------------------------------------------------------- dots

DOTS_TOOLS = tools("search", q="string") + tool("place", {
    "type": "object",
    "$defs": {"Spot": {"type": "object", "properties": {"city": {"type": "string"}}}},
    "properties": {"spot": {"$ref": "#/$defs/Spot"}, "days": {"type": "integer"}}})


def dots(body: str) -> str:
    return f"<dots_function_call>{body}</dots_function_call>"


def test_dots_invokes_json_bodies_and_text_between():
    text = ("a" + dots('<invoke name="place"><parameter name="spot">{"city": "Kyiv"}</parameter>'
                       '<parameter name="days">2</parameter></invoke>')
            + "b" + dots('{"name": "search", "arguments": {"q": "tables"}}') + "c")
    msg = both(text, tool_parser="dots", tools=DOTS_TOOLS)
    assert msg["content"] == "abc"
    assert calls(msg) == [("place", {"spot": {"city": "Kyiv"}, "days": 2}),
                          ("search", {"q": "tables"})]


@pytest.mark.parametrize("text,content", [
    (dots("rubbish"), "rubbish"),
    ("some words </dots_function_call>", "some words "),
    ("answer <dots_func", "answer <dots_func"),
])
def test_dots_framing_is_never_content(text, content):
    msg = both(text, tool_parser="dots", tools=DOTS_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"] == content


def test_dots_complete_json_body_cut_before_its_close_is_a_call():
    msg = both('<dots_function_call>{"name": "search", "arguments": {"q": "chairs"}}',
               tool_parser="dots", tools=DOTS_TOOLS)
    assert calls(msg) == [("search", {"q": "chairs"})] and msg["content"] is None


# --------------------------------------------------------------------------- Spark / IQuest

SPARK_TOOLS = tools("state", name="string", count="integer", ratio="number", on="boolean",
                    items="array", meta="object") + tools("now")


def spark(name: str, *pairs: tuple[str, str]) -> str:
    return (f"<tool_call>{name}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>"
                                          for k, v in pairs) + "</tool_call>")


def test_spark_values_and_text_around_calls():
    text = ("before" + spark("state", ("name", "上海"), ("count", "42"), ("ratio", "2.5"),
                             ("on", "1"), ("items", '["a"]'), ("meta", '{"k": 1}'))
            + "middle" + spark("now") + "after")
    msg = both(text, tool_parser="spark25", tools=SPARK_TOOLS)
    assert msg["content"] == "beforemiddleafter"
    assert calls(msg) == [("state", {"name": "上海", "count": 42, "ratio": 2.5, "on": True,
                                     "items": ["a"], "meta": {"k": 1}}), ("now", {})]


def test_spark_null_failed_conversion_and_undeclared_parameter():
    text = spark("state", ("name", "null"), ("count", "lots"), ("on", "0"), ("extra", "42"))
    assert calls(both(text, tool_parser="spark25", tools=SPARK_TOOLS)) == [
        ("state", {"name": None, "count": "lots", "on": False, "extra": "42"})]


@pytest.mark.parametrize("text", ["x<tool_call></tool_call>y", "plain<tool_",
                                  "plain<tool_call>state<arg_key>count</arg_key>"])
def test_spark_empty_or_cut_block_is_content(text):
    msg = both(text, tool_parser="spark25", tools=SPARK_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"] == text


IQ_TOOLS = tools("run", code="string", count="integer", on="boolean", items="array")
IQ_CALL = ("<iquest_tool_call>run\n<arg_key>code</arg_key><arg_value>  \"12\"\n</arg_value>"
           "<arg_key>count</arg_key> <arg_value>42</arg_value>\n<arg_key>on</arg_key>"
           "<arg_value>true</arg_value><arg_key>items</arg_key><arg_value>[1, null]</arg_value>"
           "</iquest_tool_call>")
IQ_ARGS = {"code": '  "12"\n', "count": 42, "on": True, "items": [1, None]}
IQ_BAD = "<iquest_tool_call>run<arg_key>count</arg_key><arg_value>1</iquest_tool_call>"


@pytest.mark.parametrize("text,content,n", [
    ("before" + IQ_CALL + "between" + IQ_CALL + "after", "beforebetweenafter", 2),
    (IQ_BAD + IQ_CALL + "after", IQ_BAD + "after", 1),
    (IQ_CALL + "after<iquest_tool_call>run<arg_key>code</arg_key>",
     "after<iquest_tool_call>run<arg_key>code</arg_key>", 1),
    ("查询中。" + IQ_CALL + "<|iquest_end|>", "查询中。<|iquest_end|>", 1),
])
def test_iquest_keeps_text_and_malformed_blocks_around_calls(text, content, n):
    msg = both(text, tool_parser="iquest_q1", tools=IQ_TOOLS)
    assert msg["content"] == content and calls(msg) == [("run", IQ_ARGS)] * n


def test_iquest_string_declared_through_a_ref_keeps_digits():
    declared = tool("run", {"type": "object", "$defs": {"c": {"type": "string"}},
                            "properties": {"code": {"$ref": "#/$defs/c"}}})
    text = ("<iquest_tool_call>run<arg_key>code</arg_key><arg_value>42</arg_value>"
            "</iquest_tool_call>")
    assert calls(both(text, tool_parser="iquest_q1", tools=declared)) == [("run", {"code": "42"})]


# --------------------------------------------------------------------------- Inkling payloads

INK_TOOLS = tool("forecast", {"type": "object"})
INVOKE, END = "<|content_invoke_tool_json|>", "<|end_message|>"


@pytest.mark.parametrize("reasoning", [None, "inkling"])
@pytest.mark.parametrize("payload", ['{"args":{}}', "[1, 2, 3]"])
def test_inkling_payload_without_a_name_is_content_without_framing(reasoning, payload):
    msg = both(INVOKE + payload + END, tool_parser="inkling", reasoning_parser=reasoning,
               tools=INK_TOOLS)
    assert msg["tool_calls"] == [] and msg["content"] == payload


@pytest.mark.parametrize("reasoning", [None, "inkling"])
def test_inkling_control_tokens_after_the_payload_do_not_reject_it(reasoning):
    text = INVOKE + '{"name":"forecast","args":{"d":1}}<|content_thinking|>' + END
    msg = both(text, tool_parser="inkling", reasoning_parser=reasoning, tools=INK_TOOLS)
    assert calls(msg) == [("forecast", {"d": 1})] and msg["content"] is None


def test_inkling_payload_cut_by_the_end_of_the_stream_is_a_call():
    text = "Checking." + INVOKE + '{"name":"forecast","args":{"city":"SF"}}'
    msg = both(text, tool_parser="inkling", tools=INK_TOOLS)
    assert calls(msg) == [("forecast", {"city": "SF"})] and msg["content"] == "Checking."


# --------------------------------------------------------------------------- GigaChat / Poolside

GIGA = tools("remember", action="string", content={"anyOf": [{"type": "string"}, {"type": "null"}]})
GIGA_HEAD = "<|message_sep|>\n\nfunction call<|role_sep|>\n"


@pytest.mark.parametrize("body,expected", [
    ('{"name": "remember", "arguments": {}}', {}),
    ('{"name": "remember", "arguments": {"content": {"short": true}}}',
     {"content": {"short": True}}),
])
def test_gigachat_arguments_are_taken_as_written(body, expected):
    msg = both("Noted." + GIGA_HEAD + body + "</s>", tool_parser="gigachat3", tools=GIGA)
    assert msg["content"] == "Noted." and calls(msg) == [("remember", expected)]


@pytest.mark.parametrize("body", ['{"arguments": {"action": "add"}}',
                                  '{"name": "remember", "arguments": "as text"}'])
def test_gigachat_call_object_without_a_name_or_with_text_arguments_is_no_call(body):
    assert parse_message(GIGA_HEAD + body, tool_parser="gigachat3",
                         tools=GIGA)["tool_calls"] == []


POOL = (tools("forecast", place="string", count="integer", opts="object")
        + tools("search", q="string"))


@pytest.mark.parametrize("text,expected", [
    ("<tool_call>forecast\n<arg_key>opts</arg_key>\n<arg_value>{1, 2}</arg_value>\n</tool_call>",
     [("forecast", {"opts": "{1, 2}"})]),
    ("<tool_call>forecast\n<arg_key>place</arg_key></tool_call><tool_call>search\n"
     "<arg_key>q</arg_key>\n<arg_value>tacos</arg_value>\n</tool_call>",
     [("forecast", {}), ("search", {"q": "tacos"})]),
    ("<tool_call>forecast\n<arg_key>place</arg_key><arg_key>count</arg_key><arg_value>3"
     "</arg_value>\n</tool_call>", [("forecast", {"count": 3})]),
])
def test_poolside_orphan_keys_and_unconvertible_values(text, expected):
    assert calls(both(text, tool_parser="poolside_v1", tools=POOL)) == expected


@pytest.mark.parametrize("text", [
    "<tool_call>forecast\n<arg_key>place</arg_key>\n<arg_value>San Fr",
    "<tool_call>forecast\n<arg_key>place</arg_key>\n<arg_value>SF</arg_value>\n",
])
def test_poolside_call_cut_by_the_end_of_the_stream_is_no_call(text):
    msg = both(text, tool_parser="poolside_v1", tools=POOL)
    assert msg["tool_calls"] == [] and msg["content"] == text


# ------------------------------------------------------------------ GLM-4.7, LFM2, Apertus

def test_glm47_over_escaped_array_and_whitespace_of_strings():
    declared = tools("todo", items="array", old="string")
    raw = r'[{\"id\": \"1\", \"task\": \"see C:\\\\tmp and \\\\n\"}]'
    text = (f"<tool_call>todo<arg_key>items</arg_key><arg_value>{raw}</arg_value>"
            "<arg_key>old</arg_key><arg_value>    def f():  </arg_value></tool_call>")
    assert calls(both(text, tool_parser="glm47", tools=declared)) == [
        ("todo", {"items": [{"id": "1", "task": "see C:\\tmp and \\n"}],
                  "old": "    def f():  "})]


def test_glm47_string_first_for_a_string_or_number_parameter():
    declared = tools("q", v={"oneOf": [{"type": "string"}, {"type": "number"}]},
                     w={"anyOf": [{"type": "string"}, {"type": "object"}]})
    text = ("<tool_call>q<arg_key>v</arg_key><arg_value>5</arg_value><arg_key>w</arg_key>"
            "<arg_value>hi</arg_value></tool_call>")
    assert calls(both(text, tool_parser="glm47", tools=declared)) == [("q", {"v": "5", "w": "hi"})]


def test_lfm2_json_list_and_pythonic_list_alike():
    declared = tools("forecast", place="string", units="string") + tools("search", q="string")
    pythonic = ('<|tool_call_start|>[forecast(place="Lima", units="C"), search(q="x")]'
                '<|tool_call_end|>')
    as_json = ('<|tool_call_start|>[{"name": "forecast", "arguments": {"place": "Lima", '
               '"units": "C"}}, {"name": "search", "arguments": {"q": "x"}}]<|tool_call_end|>')
    expected = [("forecast", {"place": "Lima", "units": "C"}), ("search", {"q": "x"})]
    for text in (pythonic, "Sure! " + as_json):
        msg = both(text, tool_parser="lfm2", tools=declared)
        assert calls(msg) == expected and msg["content"] in (None, "Sure!")


def test_apertus_blocks_with_text_between_and_a_cut_block():
    declared = tools("forecast", "clock")
    block = lambda *c: "<|tools_prefix|>" + json.dumps(list(c)) + "<|tools_suffix|>"
    text = ("before" + block({"forecast": {"city": "Zürich"}}) + "between"
            + block({"clock": {}}, {"forecast": {"city": "Tokyo"}}) + "done")
    msg = both(text, tool_parser="apertus2509", tools=declared)
    assert msg["content"] == "beforebetweendone"
    assert calls(msg) == [("forecast", {"city": "Zürich"}), ("clock", {}),
                          ("forecast", {"city": "Tokyo"})]
    cut = '<|tools_prefix|>[{"clock": {"zone":'
    msg = both(block({"clock": {}}) + cut, tool_parser="apertus2509", tools=declared)
    assert calls(msg) == [("clock", {})] and msg["content"] == cut
