"""The fact sheet's exact examples and per-format rules of the XML-parameter tool parsers,
plus schema-driven value typing. Every example is also checked streamed, one char at a time."""

from __future__ import annotations

import json

import pytest

from engine.api.parsers import SCHEMA_TYPING, ValueTyping, schema_types
from engine_tool_hunyuan.impl import HUNYUAN_TYPING
from engine_tool_mimo.impl import MIMO_TYPING
from engine_tool_spark25.impl import SPARK_TYPING
from xml_tool_cases import B, I, M3, N, S, TOOLS, make, parsed, stream, tool

GLM_TYPING = ValueTyping(typed="loose", untyped="loose")
QWEN3_CODER_TYPING = ValueTyping(trim="newline", typed="schema", untyped="raw", null_word=True)

EXTRA_TOOLS = TOOLS + [
    tool("execute_bash", {"command": S}),
    tool("search", {"query": S}),
    tool("weather.get", {"city": S, "days": I, "units": {"type": "object"}}),
    tool("flags", {"on": B, "n": {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "x": {"type": ["object", "null"]}}),
    tool("tree", {"cfg": {"type": "object", "properties": {"depth": I, "opt": {"type": ["string", "null"]}}},
                  "ids": {"type": "array", "items": I}, "tag": S}),
]
W = [("get_weather", {"city": "Paris", "days": 3})]
W2 = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]
DS = "｜DSML｜"
GC = "｜GCML｜"


def dsml_v4(params: str, block: str = "tool_calls", ns: str = DS) -> str:
    return f'<{ns}{block}>\n<{ns}invoke name="get_weather">\n{params}</{ns}invoke>\n</{ns}{block}>'


def p(ns: str, key: str, flag: str | None, value: str) -> str:
    attr = "" if flag is None else f' string="{flag}"'
    return f'<{ns}parameter name="{key}"{attr}>{value}</{ns}parameter>\n'


# (name, text, content, [(tool, args)])
EXAMPLES = [
    ("deepseekv4", f'Checking.\n\n<{DS}tool_calls>\n<{DS}invoke name="get_weather">\n<{DS}parameter name="city" string="true">Paris</{DS}parameter>\n<{DS}parameter name="days" string="false">3</{DS}parameter>\n</{DS}invoke>\n</{DS}tool_calls>', "Checking.", W),
    ("gigachat35", f'<{GC}tool_calls><{GC}invoke name="get_weather"><{GC}parameter name="city" string="true">Tokyo</{GC}parameter></{GC}invoke><{GC}invoke name="get_time"><{GC}parameter name="tz" string="true">Asia/Tokyo</{GC}parameter></{GC}invoke></{GC}tool_calls>', "", [("get_weather", {"city": "Tokyo"}), ("get_time", {"tz": "Asia/Tokyo"})]),
    ("gigachat35", f'Sure.\n\n<{GC}tool_calls><{GC}invoke name="get_time"><{GC}parameter name="tz" string="true">CET</{GC}parameter></{GC}invoke></{GC}tool_calls><|message_sep|>', "Sure.", [("get_time", {"tz": "CET"})]),
    ("gigachat35", "Just text.</s>", "Just text.", []),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", "", W),
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", "", W),
    ("glm45", "<tool_call>get_time\\n<arg_key>tz</arg_key><arg_value>CET</arg_value></tool_call>", "", [("get_time", {"tz": "CET"})]),
    ("glm45", "<tool_call>get_time</tool_call>", "<tool_call>get_time</tool_call>", []),
    ("glm47", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_time<arg_key>tz</arg_key><arg_value>CET</arg_value></tool_call>", "", W2),
    ("glm47", "<tool_call>get_time</tool_call>", "", [("get_time", {})]),
    ("ling3", "<tool_call>get_time</tool_call>", "", [("get_time", {})]),
    ("ling3", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", "", [("get_weather", {"city": "Paris"})]),
    ("poolside_v1", "<tool_call>get_time</tool_call>", "", [("get_time", {})]),
    ("poolside_v1", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", "", [("get_weather", {"city": "Paris"})]),
    ("poolside_v1", "<tool_call>get_weather\n<arg_key>x</arg_key>\n<arg_key>city</arg_key>\n<arg_value>\nParis\n</arg_value>\n<arg_key>days</arg_key>\n</tool_call>", "", [("get_weather", {"city": "Paris"})]),
    ("poolside_v1", "A<tool_call>\n</tool_call>B", "AB", []),
    ("spark25", "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Paris</arg_value>\n</tool_call>", "", [("get_weather", {"city": "Paris"})]),
    ("iquest_q1", "<iquest_tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></iquest_tool_call>", "", [("get_weather", {"city": "Paris"})]),
    ("iquest_q1", "<iquest_tool_call>get_time<arg_key>tz</arg_key><arg_value>CET</arg_value></iquest_tool_call>\n<iquest_tool_call>run</iquest_tool_call>", "<iquest_tool_call>run</iquest_tool_call>", [("get_time", {"tz": "CET"})]),
    ("hunyuan", "<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>get_time<tool_sep>\n<arg_key>tz</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>\n</tool_calls>", "", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("hunyuan", "Go <tool_calls>\n<tool_call>get_time<tool_sep><arg_key>tz</arg_key><arg_value>CET</arg_value></tool_call>", "Go <tool_calls>", [("get_time", {"tz": "CET"})]),
    ("k2_horizon", "<ifm|tool_calls>\n<ifm|tool_call>get_weather<ifm|arg_key>city</ifm|arg_key><ifm|arg_value>Paris</ifm|arg_value></ifm|tool_call>\n</ifm|tool_calls>", "", [("get_weather", {"city": "Paris"})]),
    ("k2_horizon", '<ifm|tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</ifm|tool_call>', "", [("get_weather", {"city": "Paris"})]),
    ("k2_horizon", '<ifm|tool_call>[{"name": "get_time", "arguments": {"tz": "CET"}}, {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]</ifm|tool_call>', "", [("get_time", {"tz": "CET"}), ("get_weather", {"city": "Paris"})]),
    ("k2_horizon", "<ifm|tool_call>put<ifm|arg_key>extra</ifm|arg_key><ifm|arg_type>string</ifm|arg_type><ifm|arg_value>5</ifm|arg_value><ifm|arg_key>n</ifm|arg_key><ifm|arg_value>5</ifm|arg_value></ifm|tool_call>", "", [("put", {"extra": "5", "n": 5})]),
    ("k2_horizon", "<ifm|tool_calls><ifm|tool_call>nope</ifm|tool_call>\n<ifm|tool_call>get_time</ifm|tool_call></ifm|tool_calls>", "<ifm|tool_call>nope</ifm|tool_call>", [("get_time", {})]),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "", W),
    ("step3p5", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "", W),
    ("qwen3_coder", "<tool_call>\n<function=put>\n<parameter=note>\nnull\n</parameter>\n<parameter=count>\n5\n<parameter=extra>\n3\n</function>\n</tool_call>", "", [("put", {"note": None, "count": 5, "extra": "3"})]),
    ("step3p5", "<tool_call>\n<function get_weather>\n<parameter city>\nParis\n</parameter>\n</tool_call>", "", [("get_weather", {"city": "Paris"})]),
    ("step3p5", "Now <function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>", "Now", [("get_time", {"tz": "CET"})]),
    ("qwen3_coder", "Now <function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>", "Now <function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>", []),
    ("mimo", "<tool_call>\n<function=execute_bash>\n<parameter=command>pwd && ls</parameter>\n</function>\n</tool_call>", "", [("execute_bash", {"command": "pwd && ls"})]),
    ("mimo", "<tool_call>\n<function=execute_bash>\n<parameter=command>\na &amp;&amp; b\n</parameter>\n</function>\n</tool_call>", "", [("execute_bash", {"command": "\na && b\n"})]),
    ("nanbeige", "<tool_call>\n<function=get_weather>\n<parameter=city>\nSF\n</parameter>\n</function>\n</tool_call>", "", [("get_weather", {"city": "SF"})]),
    ("nanbeige", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "SF"}}\n</tool_call>', "", [("get_weather", {"city": "SF"})]),
    ("minimax-m2", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="tz">CET</parameter>\n</invoke>\n</minimax:tool_call>', "", W2),
    ("minimax-m2", '<minimax:tool_call>\n<invoke name="flags">\n<parameter name="on">true</parameter>\n<parameter name="n">5</parameter>\n<parameter name="x">null</parameter>\n</invoke>\n</minimax:tool_call>', "", [("flags", {"on": True, "n": 5, "x": None})]),
    ("dots", '<dots_function_call>\n<invoke name="search">\n<parameter name="query">weather in Shanghai</parameter>\n</invoke>\n</dots_function_call>', "", [("search", {"query": "weather in Shanghai"})]),
    ("dots", 'a <dots_function_call>{"name": "search", "arguments": {"query": "x"}}</dots_function_call> b', "a b", [("search", {"query": "x"})]),
    ("muse", 'One sec. <|start|>assistant to=weather.get<|message|><atem:function_calls>\n<atem:invoke name="weather.get">\n<atem:parameter name="city">Paris</atem:parameter>\n<atem:parameter name="days">3</atem:parameter>\n<atem:parameter name="units">{"temp": "C"}</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eom|>', "One sec.", [("weather.get", {"city": "Paris", "days": 3, "units": {"temp": "C"}})]),
    ("muse", '<|start|>assistant to=user<|message|>done<|eot|>', "done", []),
    ("muse", '<|start|>assistant to=weather.get<|message|><atem:function_calls><atem:invoke name="weather.weather.get"></atem:invoke><atem:invoke name="get"></atem:invoke></atem:function_calls><|eom|>', "", [("weather.get", {}), ("weather.get", {})]),
    ("step3", '<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">\n<steptml:parameter name="city">Paris</steptml:parameter>\n<steptml:parameter name="days">3</steptml:parameter>\n</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>', "", W),
    ("step3", 'Before <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_time"><steptml:parameter name="tz"> CET </steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜> after', "Before after", [("get_time", {"tz": "CET"})]),
    ("minimax-m3", f'{M3}<tool_call>{M3}<invoke name="get_weather">{M3}<city>Paris{M3}</city>{M3}<days>3{M3}</days>{M3}</invoke>{M3}</tool_call>', "", W),
    ("minimax-m3", f'{M3} <tool_call>\n{M3} <invoke name="tree">\n{M3}<cfg>{M3}<depth>2{M3}</depth>{M3}<opt>NULL{M3}</opt>{M3}</cfg>{M3}<ids>{M3}<item>1{M3}</item>{M3}<item>2{M3}</item>{M3}</ids>{M3}<tag>a{M3}</tag>{M3}<tag>b{M3}</tag>{M3}</invoke>{M3}</tool_call>', "", [("tree", {"cfg": {"depth": 2, "opt": None}, "ids": [1, 2], "tag": ["a", "b"]})]),
    ("minimax-m3", f'{M3}<tool_call>{M3}<invoke name="flags">{M3}<on>yes{M3}</on>{M3}</invoke>{M3}</tool_call>', "", [("flags", {"on": True})]),
    ("minicpm5", '<function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function><function name="get_time"><param name="tz"><![CDATA[Europe/Paris]]></param></function>', "", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "Europe/Paris"})]),
    ("minicpm5", '<function name="get_weather"><param name="days">3</param></function>', '<function name="get_weather"><param name="days">3</param></function>', []),
    ("minicpm5", '<function name="get_time"><param name="tz">A</param><param name="tz">B</param></function>', '<function name="get_time"><param name="tz">A</param><param name="tz">B</param></function>', []),
    ("deepseekv32", '<function_calls>\n<invoke name="get_time">\n<parameter name="tz" string="true"> CET </parameter>\n</invoke>\n</｜DSML｜function_calls>', "", [("get_time", {"tz": "CET"})]),
    ("deepseekv32", f'<{DS}function_calls><{DS}invoke name="get_weather">{{"city": "Paris", "days": 3}}</{DS}invoke></{DS}function_calls>', "", W),
    ("deepseekv41", f'<{DS} calls>\n<{DS} invoke name="get_time">\n<{DS} parameter name="tz" string="true">CET</{DS} parameter>\n</{DS} invoke>\n</{DS} calls>', "", [("get_time", {"tz": "CET"})]),
    ("deepseekv41", dsml_v4(p(DS, "city", "true", "Paris")), dsml_v4(p(DS, "city", "true", "Paris")), []),
]

# DeepSeek-V4 strictness: each body is malformed for deepseekv4 (content) but a call for V3.2
STRICT = [
    p(DS, "city", "maybe", "Paris"),
    p(DS, "city", "true", "Paris") + p(DS, "city", "true", "Rome"),
    p(DS, "city", "true", "Paris") + p(DS, "days", "false", "NaN"),
    p(DS, "city", "true", "Paris") + p(DS, "days", "true", "three"),
    p(DS, "days", "false", "3"),
]


def as_expected(name, calls):
    compact = (",", ":") if name == "spark25" else (", ", ": ")
    return [(n, json.dumps(a, ensure_ascii=False, separators=compact)) for n, a in calls]


@pytest.mark.parametrize("name, text, content, calls", EXAMPLES)
def test_fact_sheet_examples(name, text, content, calls):
    whole = parsed(make(name, EXTRA_TOOLS).parse(text))
    assert whole == (content, as_expected(name, calls))
    assert stream(make(name, EXTRA_TOOLS), list(text)) == whole


@pytest.mark.parametrize("params", STRICT)
def test_deepseekv4_is_strict(params):
    text = dsml_v4(params)
    assert parsed(make("deepseekv4").parse(text)) == (text, [])
    lenient = dsml_v4(params.replace(' string="maybe"', ""), block="function_calls")
    assert [c.name for c in make("deepseekv32").parse(lenient).calls] == ["get_weather"]


def test_hunyuan_suffixed_tokens_from_template():
    template = "{{ '<tool_calls:opensource>' }}<tool_call:opensource>{{ name }}<tool_sep:opensource>"
    text = "<tool_calls:opensource><tool_call:opensource>get_time<tool_sep:opensource><arg_key>tz</arg_key><arg_value>CET</arg_value></tool_call:opensource></tool_calls:opensource>"
    assert parsed(make("hunyuan", chat_template=template).parse(text)) == ("", [("get_time", '{"tz": "CET"}')])


# (typing, raw text, property schema, value)
TYPING = [
    (GLM_TYPING, "3", I, 3),
    (GLM_TYPING, "3", S, "3"),
    (GLM_TYPING, "abc", I, "abc"),
    (GLM_TYPING, '{\\"a\\": 1}', {"type": "object"}, {"a": 1}),
    (GLM_TYPING, "{'a': (1, 2)}", {"type": "object"}, {"a": [1, 2]}),
    (GLM_TYPING, "2.5", None, 2.5),
    (GLM_TYPING, "NaN", N, "NaN"),
    (QWEN3_CODER_TYPING, "\n42\n", I, 42),
    (QWEN3_CODER_TYPING, "\n007\n", S, "007"),
    (QWEN3_CODER_TYPING, "\n1.5\n", {"type": "float"}, 1.5),
    (QWEN3_CODER_TYPING, "True", {"type": "bool"}, True),
    (QWEN3_CODER_TYPING, "null", I, None),
    (QWEN3_CODER_TYPING, "[1, 2]", {"type": "array"}, [1, 2]),
    (QWEN3_CODER_TYPING, "\n3\n", None, "3"),
    (SPARK_TYPING, "1", B, True),
    (SPARK_TYPING, "0", B, False),
    (SPARK_TYPING, "3", N, 3),
    (SPARK_TYPING, "x", I, "x"),
    (SPARK_TYPING, "null", I, None),
    (HUNYUAN_TYPING, "5", {"type": "int"}, 5),
    (HUNYUAN_TYPING, "5", {"type": "str"}, "5"),
    (HUNYUAN_TYPING, "true", {"anyOf": [I, B]}, True),
    (MIMO_TYPING, "a &lt;b&gt;", S, "a <b>"),
    (MIMO_TYPING, "inf", N, "inf"),
    (SCHEMA_TYPING, "7", {"anyOf": [S, I]}, 7),
    (SCHEMA_TYPING, "x", {"anyOf": [S, I]}, "x"),
    (SCHEMA_TYPING, "2", {"enum": [1, 2]}, 2),
    (SCHEMA_TYPING, "[1]", None, [1]),
    (SCHEMA_TYPING, "4", {"$ref": "#/$defs/n"}, 4),
]


@pytest.mark.parametrize("typing, text, prop, value", TYPING)
def test_value_typing(typing, text, prop, value):
    root = {"$defs": {"n": {"type": "integer"}}}
    got = typing.convert(text, prop, root)
    assert got == value and type(got) is type(value)


def test_schema_types():
    root = {"$defs": {"x": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}
    assert schema_types({"$ref": "#/$defs/x"}, root) == ["integer", "null"]
    assert schema_types({"type": ["string", "int64"]}) == ["string", "integer"]
    assert schema_types({"enum": ["a", 1]}) == ["string", "integer"]
    assert schema_types({}) == []
