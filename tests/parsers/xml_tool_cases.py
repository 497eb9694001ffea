"""Shared cases for the XML-parameter tool parsers: tools, per-format encoders, stream driver."""

from __future__ import annotations

import json
import random
from typing import Any, Callable

from engine.parsers.base import ToolParser
from engine.assembly import parser_factory


def tool(name: str, props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    params = {"type": "object", "properties": props, "required": list(required)}
    return {"type": "function", "function": {"name": name, "parameters": params}}


S, I, N, B = ({"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"})
PAYLOAD = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": I},
        "c": S,
        "d": {"type": "object", "properties": {"e": B}},
    },
}
TOOLS = [
    tool("get_weather", {"city": S, "days": I}, ("city",)),
    tool("get_time", {"tz": S}),
    tool(
        "put",
        {
            "payload": PAYLOAD,
            "tags": {"type": "array", "items": S},
            "note": S,
            "count": I,
            "ratio": N,
            "flag": B,
            "code": S,
        },
    ),
]

ONE = [("get_weather", {"city": "Paris", "days": 3})]
TWO = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]
#: int, number, bool, object, array, unicode, quotes and a backslash, a string that looks numeric
COMPLEX = [
    (
        "put",
        {
            "payload": {"a": [1, 2], "c": "x", "d": {"e": True}},
            "tags": ["α", "β"],
            "note": 'He said "hi" \\ 你好 ü',
            "count": 7,
            "ratio": 2.5,
            "flag": True,
            "code": "42",
        },
    )
]
UNKNOWN = [("nope", {"city": "Paris"})]


def raw(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


Calls = list[tuple[str, dict[str, Any]]]


def glm(sep: str = "\n", pair_sep: str = "\n", kv: str = "\n") -> Callable[[Calls], str]:
    def enc(calls: Calls) -> str:
        return "\n".join(
            f"<tool_call>{n}{sep}"
            + "".join(f"<arg_key>{k}</arg_key>{kv}<arg_value>{raw(v)}</arg_value>{pair_sep}" for k, v in a.items())
            + "</tool_call>"
            for n, a in calls
        )

    return enc


def iquest(calls: Calls) -> str:
    return "".join(
        f"<iquest_tool_call>{n}"
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{raw(v)}</arg_value>" for k, v in a.items())
        + "</iquest_tool_call>"
        for n, a in calls
    )


def hunyuan(calls: Calls) -> str:
    body = "".join(
        f"<tool_call>{n}<tool_sep>\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{raw(v)}</arg_value>\n" for k, v in a.items())
        + "</tool_call>\n"
        for n, a in calls
    )
    return f"<tool_calls>\n{body}</tool_calls>"


def k2(calls: Calls) -> str:
    body = "".join(
        f"<ifm|tool_call>{n}"
        + "".join(
            f"<ifm|arg_key>{k}</ifm|arg_key><ifm|arg_value>{raw(v)}</ifm|arg_value>" for k, v in a.items()
        )
        + "</ifm|tool_call>\n"
        for n, a in calls
    )
    return f"<ifm|tool_calls>\n{body}</ifm|tool_calls>"


def qwen3(wrap: str = "\n") -> Callable[[Calls], str]:
    def enc(calls: Calls) -> str:
        return "\n".join(
            f"<tool_call>\n<function={n}>\n"
            + "".join(f"<parameter={k}>{wrap}{raw(v)}{wrap}</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>"
            for n, a in calls
        )

    return enc


def dsml(block: str, ns: str) -> Callable[[Calls], str]:
    def enc(calls: Calls) -> str:
        body = "".join(
            f'<{ns}invoke name="{n}">\n'
            + "".join(
                f'<{ns}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">{raw(v)}</{ns}parameter>\n'
                for k, v in a.items()
            )
            + f"</{ns}invoke>\n"
            for n, a in calls
        )
        return f"<{ns}{block}>\n{body}</{ns}{block}>"

    return enc


def invoke(open_: str, close: str, ns: str = "", quote: str = '"') -> Callable[[Calls], str]:
    def enc(calls: Calls) -> str:
        body = "".join(
            f"<{ns}invoke name={quote}{n}{quote}>\n"
            + "".join(f'<{ns}parameter name="{k}">{raw(v)}</{ns}parameter>\n' for k, v in a.items())
            + f"</{ns}invoke>\n"
            for n, a in calls
        )
        return f"{open_}\n{body}{close}"

    return enc


def step3(calls: Calls) -> str:
    body = "".join(
        f'<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{n}">\n'
        + "".join(f'<steptml:parameter name="{k}">{raw(v)}</steptml:parameter>\n' for k, v in a.items())
        + "</steptml:invoke><｜tool_call_end｜>\n"
        for n, a in calls
    )
    return f"<｜tool_calls_begin｜>\n{body}<｜tool_calls_end｜>"


def minicpm(calls: Calls) -> str:
    return "".join(
        f'<function name="{n}">'
        + "".join(f'<param name="{k}">{raw(v)}</param>' for k, v in a.items())
        + "</function>"
        for n, a in calls
    )


def muse(calls: Calls) -> str:
    return "".join(
        f"<|start|>assistant to={n}<|message|>"
        + invoke("<atem:function_calls>", "</atem:function_calls>", "atem:")([(n, a)])
        + "<|eom|>"
        for n, a in calls
    )


M3 = "]<]minimax[>["


def m3_value(v: Any) -> str:
    if isinstance(v, dict):
        return "".join(f"{M3}<{k}>{m3_value(x)}{M3}</{k}>" for k, x in v.items())
    if isinstance(v, list):
        return "".join(f"{M3}<item>{m3_value(x)}{M3}</item>" for x in v)
    return raw(v)


def minimax_m3(calls: Calls) -> str:
    body = "".join(f'{M3}<invoke name="{n}">{m3_value(a)}{M3}</invoke>' for n, a in calls)
    return f"{M3}<tool_call>{body}{M3}</tool_call>"


#: name -> (encoder, a terminated but malformed call text)
FORMATS: dict[str, tuple[Callable[[Calls], str], str]] = {
    "glm45": (glm(), "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"),
    "glm": (glm(), "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"),
    "glm47": (glm("", "", ""), "<tool_call>get_weather<arg_key>city</arg_key>oops<arg_value>Paris</arg_value></tool_call>"),
    "ling3": (glm(), "<tool_call>get_weather\n<arg_key>city</arg_key>oops<arg_value>Paris</arg_value></tool_call>"),
    "poolside_v1": (glm(), "<tool_call>get_weather\n<arg_key>city</arg_key>oops<arg_value>Paris</arg_value></tool_call>"),
    "spark25": (glm("\n", "\n", ""), "<tool_call>get_weather\n<arg_key>city</arg_key> <arg_value>Paris</arg_value>\n</tool_call>"),
    "iquest_q1": (iquest, "<iquest_tool_call>get_weather<arg_key>city</arg_key>oops</iquest_tool_call>"),
    "hunyuan": (hunyuan, "<tool_calls>\n<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>\n</tool_calls>"),
    "k2_horizon": (k2, "<ifm|tool_calls>oops<ifm|tool_call>get_time<ifm|arg_key>tz</ifm|arg_key><ifm|arg_value>CET</ifm|arg_value></ifm|tool_call></ifm|tool_calls>"),
    "qwen3_coder": (qwen3(), "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>"),
    "step3p5": (qwen3(), "<tool_call>\njunk\n</tool_call>"),
    "mimo": (qwen3(""), "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</tool_call>"),
    "nanbeige": (qwen3(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>"),
    "deepseekv32": (dsml("function_calls", "｜DSML｜"), "<｜DSML｜function_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
    "deepseekv4": (dsml("tool_calls", "｜DSML｜"), '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'),
    "deepseekv41": (dsml("calls", "｜DSML｜ "), "<｜DSML｜ calls>\nhello\n</｜DSML｜ calls>"),
    "gigachat35": (dsml("tool_calls", "｜GCML｜"), "<｜GCML｜tool_calls><｜GCML｜invoke><｜GCML｜parameter name=\"tz\" string=\"true\">CET</｜GCML｜parameter></｜GCML｜invoke></｜GCML｜tool_calls>"),
    "minimax-m2": (invoke("<minimax:tool_call>", "</minimax:tool_call>"), "<minimax:tool_call>\n<invoke>\n</invoke>\n</minimax:tool_call>"),
    "dots": (invoke("<dots_function_call>", "</dots_function_call>", quote=""), "<dots_function_call>\n{\"name\": 1}\n</dots_function_call>"),
    "step3": (step3, '<｜tool_calls_begin｜>\n<｜tool_call_begin｜>other<｜tool_sep｜><steptml:invoke name="get_time">\n</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>'),
    "minicpm5": (minicpm, '<function name="get_time"><param name="zone">CET</param></function>'),
    "muse": (muse, "<|start|>assistant to=get_time<|message|>hello<|eom|>"),
    "minimax-m3": (minimax_m3, f'{M3}<tool_call>{M3}<invoke name="get_time">{M3}<tz>CET{M3}</city>{M3}</invoke>{M3}</tool_call>'),
}
NAMES = sorted(FORMATS)

#: formats whose schema-blind decoding turns a numeric-looking string into a number
COMPLEX_OVERRIDES = {"muse": {"code": "A-42"}}


def make(name: str, tools: list[dict[str, Any]] | None = None, chat_template: str | None = None) -> ToolParser:
    factory = parser_factory("tool_parser", name, chat_template=chat_template)
    return factory(tools=TOOLS if tools is None else tools)


def arguments(name: str, args: dict[str, Any]) -> str:
    if name == "spark25":
        return json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(args, ensure_ascii=False)


def parsed(result: Any) -> tuple[str, list[tuple[str, str]]]:
    return result.content, [(c.name, c.arguments) for c in result.calls]


def stream(parser: ToolParser, chunks: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Feed chunks then finish; check delta shape; return (content, [(name, arguments)])."""
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    for i, chunk in enumerate(chunks + [None]):
        delta = parser.finish() if chunk is None else parser.feed(chunk)
        content.append(delta.content)
        for d in delta.calls:
            if d.index not in calls:
                assert d.name is not None, "the first delta of a call carries its name"
                assert d.index == len(calls), "calls are indexed in order"
                calls[d.index] = [d.name, ""]
            else:
                assert d.name is None
            calls[d.index][1] += d.arguments
    return "".join(content), [(n, a) for n, a in (calls[i] for i in sorted(calls))]


def splits(text: str, seed: int = 0) -> list[list[str]]:
    """Every two-piece split, one-character chunks, and random 1-8 character chunks."""
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    out.append(list(text))
    rng = random.Random(seed)
    for _ in range(8):
        chunks, i = [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            chunks.append(text[i : i + n])
            i += n
        out.append(chunks)
    return out
