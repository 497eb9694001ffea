"""Wire writers, fact-sheet examples and malformed texts for the JSON-family tool parsers."""

from __future__ import annotations

import json
from typing import Any, Callable

Calls = list[tuple[str, dict[str, Any]]]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]

ONE: Calls = [("get_weather", {"city": "Paris", "days": 3})]
TWO: Calls = [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
RICH: Calls = [
    (
        "get_weather",
        {
            "city": 'São "Paulo" 東京 😀 \\ back',
            "days": -3,
            "opts": {"units": "metric", "hours": [1, 2.5, -3], "flags": {"a": True, "b": None}},
            "tags": ["x", "y z", []],
        },
    )
]
UNKNOWN: Calls = [("unknown_tool", {"city": "Paris"})]


def _j(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _py(v: Any) -> str:
    return repr(v)


def _gemma(v: Any) -> str:
    if isinstance(v, str):
        return '<|"|>' + v + '<|"|>'
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma(x) for x in v) + "]"
    return str(v)


def _k3_args(args: dict[str, Any]) -> str:
    out = []
    for k, v in args.items():
        if isinstance(v, str):
            out.append(f'<|open|>argument key="{k}" type="string"<|sep|>{v}<|close|>argument<|sep|>')
        else:
            out.append(f'<|open|>argument key="{k}" type="object"<|sep|>{_j(v)}<|close|>argument<|sep|>')
    return "".join(out)


def _qwen(calls: Calls) -> str:
    return "\n".join(
        f'<tool_call>\n{_j({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls
    )


DS = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"

#: name -> writer of a response holding ``calls`` (only the call text)
WIRE: dict[str, Callable[[Calls], str]] = {
    "qwen25": _qwen,
    "qwen": _qwen,
    "trinity": _qwen,
    "hermes": lambda cs: "".join(
        f'<tool_call>{_j({"name": n, "arguments": a})}</tool_call>' for n, a in cs
    ),
    "llama3": lambda cs: "<|python_tag|>" + ";".join(_j({"name": n, "parameters": a}) for n, a in cs),
    "mistral": lambda cs: "[TOOL_CALLS] " + _j([{"name": n, "arguments": a} for n, a in cs]),
    "mistral#compact": lambda cs: "".join(f"[TOOL_CALLS]{n}[ARGS]{_j(a)}" for n, a in cs),
    "pythonic": lambda cs: "["
    + ", ".join(f"{n}(" + ", ".join(f"{k}={_py(v)}" for k, v in a.items()) + ")" for n, a in cs)
    + "]",
    "lfm2": lambda cs: "<|tool_call_start|>["
    + ", ".join(f"{n}(" + ", ".join(f"{k}={_py(v)}" for k, v in a.items()) + ")" for n, a in cs)
    + "]<|tool_call_end|>",
    "lfm2#json": lambda cs: "<|tool_call_start|>"
    + _j([{"name": n, "arguments": a} for n, a in cs])
    + "<|tool_call_end|>",
    "deepseekv3": lambda cs: DS[0]
    + "\n".join(f"{DS[1]}function{DS[2]}{n}\n```json\n{_j(a)}\n```{DS[3]}" for n, a in cs)
    + DS[4],
    "deepseekv31": lambda cs: DS[0] + "".join(f"{DS[1]}{n}{DS[2]}{_j(a)}{DS[3]}" for n, a in cs) + DS[4],
    "kimi_k2": lambda cs: "<|tool_calls_section_begin|>"
    + "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_j(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(cs)
    )
    + "<|tool_calls_section_end|>",
    "kimi_k3": lambda cs: "<|open|>tools<|sep|>"
    + "".join(
        f'<|open|>call tool="{n}" index="{i}"<|sep|>{_k3_args(a)}<|close|>call<|sep|>'
        for i, (n, a) in enumerate(cs)
    )
    + "<|close|>tools<|sep|>",
    "gpt-oss": lambda cs: "".join(
        f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{_j(a)}<|call|>"
        for n, a in cs
    ),
    "gemma4": lambda cs: "".join(f"<|tool_call>call:{n}{_gemma(a)}<tool_call|>" for n, a in cs),
    "apertus2509": lambda cs: "<|tools_prefix|>" + _j([{n: a} for n, a in cs]) + "<|tools_suffix|>",
    "cohere_command4": lambda cs: "<|START_ACTION|>"
    + _j([{"tool_call_id": str(i), "tool_name": n, "parameters": a} for i, (n, a) in enumerate(cs)])
    + "<|END_ACTION|>",
    "interns1": lambda cs: "".join(
        f'<|action_start|><|plugin|>\n{_j({"name": n, "parameters": a})}<|action_end|>' for n, a in cs
    ),
    "gigachat3": lambda cs: "".join(
        f'<|message_sep|>function call<|role_sep|>\n{_j({"name": n, "arguments": a})}' for n, a in cs
    ),
    "inkling": lambda cs: "".join(
        f'<|message_model|>{n}<|content_invoke_tool_json|>{_j({"name": n, "args": a})}<|end_message|>'
        for n, a in cs
    ),
}


def plugin_of(key: str) -> str:
    """``mistral#compact`` -> ``mistral``."""
    return key.split("#")[0]


#: a malformed call per writer key: no call, and the text stays in the content
MALFORMED: dict[str, str] = {
    "qwen25": '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
    "qwen": '<tool_call>\n{"name": "get_weather" "arguments": {}}\n</tool_call>',
    "trinity": "<tool_call>\nnot json at all\n</tool_call>",
    "hermes": '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>',
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": [1, 2]}',
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}]',
    "mistral#compact": '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}',
    "pythonic": "[get_weather(city=open('x'))]",
    "lfm2": '<|tool_call_start|>[get_weather(**{"city": "Paris"})]<|tool_call_end|>',
    "lfm2#json": '<|tool_call_start|>[{"arguments": {}}]<|tool_call_end|>',
    "deepseekv3": DS[0] + DS[1] + "function" + DS[2] + "get_weather\n```json\n{city: 1}\n```" + DS[3] + DS[4],
    "deepseekv31": DS[0] + DS[1] + "get_weather" + DS[2] + '["Paris"]' + DS[3] + DS[4],
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{'city': 'Paris'}<|tool_call_end|><|tool_calls_section_end|>",
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="get_weather"<|sep|>Paris<|close|>call<|sep|>'
    "<|close|>tools<|sep|>",
    "gpt-oss": "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{city: Paris}<|call|>",
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>',
    "apertus2509": '<|tools_prefix|>[{"get_weather": {"city": "Paris"}, "x": 1}]<|tools_suffix|>',
    "cohere_command4": '<|START_ACTION|>[{"tool_name": "get_weather", "parameters": "Paris"}]<|END_ACTION|>',
    "interns1": '<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": {"city": "Paris"}}}'
    "<|action_end|>",
    "gigachat3": '<|message_sep|>function call<|role_sep|>\n{"name": 7, "arguments": {}}',
    "inkling": '<|message_model|>get_time<|content_invoke_tool_json|>{"name":"get_weather","args":{}}'
    "<|end_message|>",
}

#: (plugin, text, stripped content, calls) taken from the fact sheet
FACT_SHEET: list[tuple[str, str, str, Calls]] = [
    ("qwen25", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Paris"})]),
    ("qwen", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     "", TWO),
    ("hermes", '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
     "", [("get_weather", {"city": "Paris"})]),
    ("trinity", '<think>plan <tool_call>\n{"name":"get_time","arguments":{"tz":"UTC"}}\n</tool_call></think>',
     "plan", [("get_time", {"tz": "UTC"})]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
     "", [("get_weather", {"city": "Paris"})]),
    ("llama3", '{"name":"get_weather","parameters":{"city":"Paris"}};{"name":"get_time","parameters":{"tz":"CET"}}',
     "", TWO),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz": "CET"}}]',
     "", TWO),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
     "", TWO),
    ("mistral", '[TOOL_CALLSget_weather[ARGS{"city": "Paris"}', "", [("get_weather", {"city": "Paris"})]),
    ("pythonic", "[get_weather(city='Paris', days=3)]", "", ONE),
    ("pythonic", '<|python_start|>[get_weather(city="Paris", days=3), get_time(tz="CET")]<|python_end|>',
     "", [ONE[0], TWO[1]]),
    ("lfm2", 'Sure.<|tool_call_start|>[get_weather(city="Paris"), get_time(tz="CET")]<|tool_call_end|>',
     "Sure.", TWO),
    ("lfm2", '<|tool_call_start|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|tool_call_end|>',
     "", [("get_weather", {"city": "Paris"})]),
    ("deepseekv3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "", [("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "Paris"})]),
    ("deepseekv31", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Tokyo"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "JST"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
     "", [("get_weather", {"city": "Tokyo"}), ("get_time", {"tz": "JST"})]),
    ("kimi_k2", '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|><|tool_calls_section_end|>',
     "", TWO),
    ("kimi_k3", '<|open|>response<|sep|>Checking.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
     "Checking.", ONE),
    ("gpt-oss", '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
     "", [("get_weather", {"city": "Paris"})]),
    ("gpt-oss", "<|channel|>analysis<|message|>User asks weather.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
     "It is sunny.", []),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>', "", ONE),
    ("apertus2509", '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}, {"get_time": {"tz": "CET"}}]<|tools_suffix|>',
     "", TWO),
    ("cohere_command4", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}, {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"tz": "CET"}}]<|END_ACTION|>',
     "", TWO),
    ("interns1", 'text<|action_start|> <|plugin|>\n{"name": "get_weather", "parameters": {"city": "Tokyo"}}<|action_end|>',
     "text", [("get_weather", {"city": "Tokyo"})]),
    ("gigachat3", 'function call<|role_sep|>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
     "", [("get_weather", {"city": "Paris"})]),
    ("gigachat3", 'Sure.<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}</s>',
     "Sure.", [("get_weather", {"city": "Paris"})]),
    ("inkling", '<|message_model|>get_weather<|content_invoke_tool_json|>{"name":"get_weather","args":{"city":"Paris"}}<|end_message|>',
     "", [("get_weather", {"city": "Paris"})]),
]

#: formats that stream a call's name before its arguments are complete
INCREMENTAL = ("hermes", "llama3", "mistral", "deepseekv3", "deepseekv31", "kimi_k2", "gigachat3")

#: formats whose name is emitted before the call is known to be well formed
EARLY_NAME = INCREMENTAL + ("gemma4", "inkling")
