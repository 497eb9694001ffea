"""Streaming cost per chunk of every installed tool-call parser.

For each parser (entry points of group ``engine.tool_parser``) a ~16,000-character response
(about 4,000 tokens: prose paragraphs and 8 tool calls in that parser's wire format, each call
carrying a ~900-character string argument) is fed in 4-character chunks. The table gives the
median over runs of (total feed + finish time) / chunks, in microseconds, and the calls the
stream yielded (8 expected; fewer means the sample does not suit the format). Exits with status
1 when the slowest parser exceeds the budget (50 µs per chunk).

    python benchmarks/parser_stream_cost.py [--runs 7] [--chunk 4] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from importlib.metadata import entry_points
from typing import Any, Callable

BUDGET_US = 50.0
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "notes": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
PROSE = (
    "The forecast models disagree a little this week, so I will compare a few sources before "
    "answering. Temperatures should stay mild, with a chance of rain on Thursday afternoon and "
    "clearer skies over the weekend; wind will pick up near the coast. "
) * 4
NOTES = (
    'Include hourly detail, the "feels like" value, humidity, UV index and pollen levels; '
    "résumé for the café terrace crew, 東京 office too. "
) * 7

Args = dict[str, Any]
Writer = Callable[[str, Args], str]


def _j(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _attrs(args: Args, fmt: str) -> str:
    return "".join(fmt.format(k=k, v=v) for k, v in args.items())


def _ds(ns: str, calls: str, inv: str, par: str) -> Writer:
    return lambda n, a: (
        f"<{ns}{calls}>\n<{ns}{inv} name=\"{n}\">\n"
        + _attrs(a, f'<{ns}{par} name="{{k}}" string="true">{{v}}</{ns}{par}>\n')
        + f"</{ns}{inv}>\n</{ns}{calls}>"
    )


_GLM = lambda n, a: f"<tool_call>{n}\n" + _attrs(a, "<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n") + "</tool_call>"
_CODER = lambda n, a: f"<tool_call>\n<function={n}>\n" + _attrs(a, "<parameter={k}>\n{v}\n</parameter>\n") + "</function>\n</tool_call>"
_DSV3 = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
_MM = "]<]minimax[>["

WRITERS: dict[str, Writer] = {
    # JSON family
    "qwen25": lambda n, a: f"<tool_call>\n{_j({'name': n, 'arguments': a})}\n</tool_call>",
    "hermes": lambda n, a: f"<tool_call>{_j({'name': n, 'arguments': a})}</tool_call>",
    "llama3": lambda n, a: "<|python_tag|>" + _j({"name": n, "parameters": a}),
    "mistral": lambda n, a: f"[TOOL_CALLS]{n}[ARGS]{_j(a)}",
    "pythonic": lambda n, a: f"[{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")]",
    "lfm2": lambda n, a: f"<|tool_call_start|>[{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")]<|tool_call_end|>",
    "deepseekv3": lambda n, a: f"{_DSV3[0]}{_DSV3[1]}function{_DSV3[2]}{n}\n```json\n{_j(a)}\n```{_DSV3[3]}{_DSV3[4]}",
    "deepseekv31": lambda n, a: f"{_DSV3[0]}{_DSV3[1]}{n}{_DSV3[2]}{_j(a)}{_DSV3[3]}{_DSV3[4]}",
    "kimi_k2": lambda n, a: f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{n}:0<|tool_call_argument_begin|>{_j(a)}<|tool_call_end|><|tool_calls_section_end|>",
    "kimi_k3": lambda n, a: f'<|open|>tools<|sep|><|open|>call tool="{n}" index="0"<|sep|>'
    + _attrs(a, '<|open|>argument key="{k}" type="string"<|sep|>{v}<|close|>argument<|sep|>')
    + "<|close|>call<|sep|><|close|>tools<|sep|>",
    "gpt-oss": lambda n, a: f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{_j(a)}<|call|>",
    "gemma4": lambda n, a: f"<|tool_call>call:{n}{{" + ",".join(f'{k}:<|"|>{v}<|"|>' for k, v in a.items()) + "}<tool_call|>",
    "apertus2509": lambda n, a: f"<|tools_prefix|>{_j([{n: a}])}<|tools_suffix|>",
    "cohere_command4": lambda n, a: "<|START_ACTION|>" + _j([{"tool_call_id": "0", "tool_name": n, "parameters": a}]) + "<|END_ACTION|>",
    "interns1": lambda n, a: f"<|action_start|><|plugin|>\n{_j({'name': n, 'parameters': a})}<|action_end|>",
    "gigachat3": lambda n, a: f"<|message_sep|>function call<|role_sep|>\n{_j({'name': n, 'arguments': a})}",
    "inkling": lambda n, a: f"<|message_model|>{n}<|content_invoke_tool_json|>{_j({'name': n, 'args': a})}<|end_message|>",
    # XML-parameter family
    "deepseekv32": _ds("｜DSML｜", "function_calls", "invoke", "parameter"),
    "deepseekv4": _ds("｜DSML｜", "tool_calls", "invoke", "parameter"),
    "deepseekv41": _ds("｜DSML｜ ", "calls", "invoke", "parameter"),
    "gigachat35": _ds("｜GCML｜", "tool_calls", "invoke", "parameter"),
    "glm45": _GLM,
    "glm47": lambda n, a: f"<tool_call>{n}" + _attrs(a, "<arg_key>{k}</arg_key><arg_value>{v}</arg_value>") + "</tool_call>",
    "spark25": lambda n, a: f"<tool_call>{n}\n" + _attrs(a, "<arg_key>{k}</arg_key><arg_value>{v}</arg_value>\n") + "</tool_call>",
    "iquest_q1": lambda n, a: f"<iquest_tool_call>{n}" + _attrs(a, "<arg_key>{k}</arg_key><arg_value>{v}</arg_value>") + "</iquest_tool_call>",
    "hunyuan": lambda n, a: f"<tool_calls>\n<tool_call>{n}<tool_sep>\n"
    + _attrs(a, "<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n") + "</tool_call>\n</tool_calls>",
    "k2_horizon": lambda n, a: f"<ifm|tool_calls>\n<ifm|tool_call>{n}"
    + _attrs(a, "<ifm|arg_key>{k}</ifm|arg_key><ifm|arg_value>{v}</ifm|arg_value>") + "</ifm|tool_call>\n</ifm|tool_calls>",
    "qwen3_coder": _CODER,
    "minimax-m2": lambda n, a: f'<minimax:tool_call>\n<invoke name="{n}">\n'
    + _attrs(a, '<parameter name="{k}">{v}</parameter>\n') + "</invoke>\n</minimax:tool_call>",
    "dots": lambda n, a: f'<dots_function_call>\n<invoke name="{n}">\n'
    + _attrs(a, '<parameter name="{k}">{v}</parameter>\n') + "</invoke>\n</dots_function_call>",
    "muse": lambda n, a: f'<|start|>assistant to={n}<|message|><atem:function_calls>\n<atem:invoke name="{n}">\n'
    + _attrs(a, '<atem:parameter name="{k}">{v}</atem:parameter>\n') + "</atem:invoke>\n</atem:function_calls><|eom|>",
    "step3": lambda n, a: f'<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{n}">\n'
    + _attrs(a, '<steptml:parameter name="{k}">{v}</steptml:parameter>\n') + "</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>",
    "minimax-m3": lambda n, a: f'{_MM}<tool_call>{_MM}<invoke name="{n}">'
    + _attrs(a, _MM + "<{k}>{v}" + _MM + "</{k}>") + f"{_MM}</invoke>{_MM}</tool_call>",
    "minicpm5": lambda n, a: f'<function name="{n}">' + _attrs(a, '<param name="{k}">{v}</param>') + "</function>",
}
ALIASES = {
    "qwen": "qwen25", "trinity": "qwen25", "glm": "glm45", "ling3": "glm45", "poolside_v1": "glm45",
    "step3p5": "qwen3_coder", "mimo": "qwen3_coder", "nanbeige": "qwen3_coder",
}


def response(name: str) -> str | None:
    writer = WRITERS.get(ALIASES.get(name, name))
    if writer is None:
        return None
    parts = []
    for i in range(8):
        parts.append(PROSE)
        parts.append(writer("get_weather", {"city": f"City {i}", "notes": NOTES}))
        parts.append("\n")
    return "".join(parts)


def load(name: str) -> Callable[..., Any]:
    from engine.assembly import parser_factory

    template = "{{ '<|tool_calls_section_begin|>' }}" if name == "auto" else None
    return parser_factory("tool_parser", name, chat_template=template)


def measure(factory: Callable[..., Any], text: str, chunk: int, runs: int) -> tuple[float, int, float]:
    """(median µs per chunk, streamed calls, median whole-parse ms)."""
    chunks = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    per_chunk, whole, calls = [], [], 0
    for _ in range(runs):
        p = factory(tools=TOOLS)
        t0 = time.perf_counter()
        deltas = [p.feed(c) for c in chunks]
        deltas.append(p.finish())
        per_chunk.append((time.perf_counter() - t0) / len(chunks) * 1e6)
        calls = len({c.index for d in deltas for c in d.calls})
        t0 = time.perf_counter()
        factory(tools=TOOLS).parse(text)
        whole.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(per_chunk), calls, statistics.median(whole)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    names = sorted(ep.name for ep in entry_points(group="engine.tool_parser"))
    if args.only:
        names = [n for n in names if n in args.only]
    print(f"{'parser':18s} {'chars':>6s} {'chunks':>6s} {'calls':>5s} {'us/chunk':>9s} {'parse ms':>9s}")
    worst = 0.0
    for name in names:
        key = "kimi_k2" if name == "auto" else name
        text = response(key)
        if text is None:
            print(f"{name:18s} (no sample writer for this format)")
            continue
        cost, calls, whole = measure(load(name), text, args.chunk, args.runs)
        worst = max(worst, cost)
        n_chunks = (len(text) + args.chunk - 1) // args.chunk
        print(f"{name:18s} {len(text):6d} {n_chunks:6d} {calls:5d} {cost:9.2f} {whole:9.2f}")
    print(f"slowest: {worst:.2f} us/chunk (budget {BUDGET_US:.0f})")
    return 0 if worst <= BUDGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
