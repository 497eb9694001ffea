"""Every reasoning-parser plugin against the fact sheet's examples, whole and streamed.

Each case is (name, text, expected (reasoning, content), chat_template_kwargs, effort, template).
Per name: reasoning only, reasoning then answer, no reasoning, truncated reasoning, plus the
format's own examples. Every case is also streamed split at every position, in one-character
chunks and in random 1-8 character chunks; streamed must equal whole except the documented
force_nonempty_content asymmetry, asserted separately.
"""

from __future__ import annotations

import random
import time
from functools import lru_cache
from typing import Any, NamedTuple

import pytest

from engine.parsers.base import ReasoningDelta
from engine.parsers.reasoning import (
    POLICIES,
    ParserFactory,
    TagReasoningParser,
    partial_tail,
    template_policy,
)
from engine.assembly import parser_factory
from engine_reasoning_auto.detect import detect_reasoning_parser


class Case(NamedTuple):
    name: str
    text: str
    expected: tuple[str, str]
    kwargs: dict[str, Any] = {}
    effort: str | None = None
    template: str | None = None


ON = {"enable_thinking": True}
OFF = {"enable_thinking": False}
TH_ON = {"thinking": True}
TH_OFF = {"thinking": False}
QWEN_TOOL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
DSML = "<｜DSML｜ calls>\n<｜DSML｜invoke name=\"get_weather\">…</｜DSML｜invoke>\n</｜DSML｜ calls>"
GLM_TOOL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "</tool_call>")
HARMONY_CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather "
                '<|constrain|>json<|message|>{"city":"Paris"}<|call|>')
MUSE_CALL = ('<|start|>assistant to=weather.get<|message|><atem:function_calls>\n'
             '<atem:invoke name="weather.get">\n<atem:parameter name="city">Paris'
             '</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eom|>')
INK_CALL = ('<|message_model|>get_weather<|content_invoke_tool_json|>'
            '{"name":"get_weather","args":{"city":"Paris"}}<|end_message|>')
K3_TOOLS = ('<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
            '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
            '<|close|>call<|sep|><|close|>tools<|sep|>')
COHERE_ACTION = ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", '
                 '"parameters": {"city": "Paris"}}]<|END_ACTION|>')
APERTUS_CALL = '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>'


def _r1(name: str) -> list[Case]:
    return [
        Case(name, "I need to add.</think>The answer is 4.",
             ("I need to add.", "The answer is 4.")),
        Case(name, "<think>I need to add.</think>\n\nThe answer is 4.",
             ("I need to add.", "\n\nThe answer is 4.")),
        Case(name, "Still thinking", ("Still thinking", "")),
        Case(name, "<think>only reasoning</think>", ("only reasoning", "")),
        Case(name, "</think>The answer.", ("", "The answer.")),
        Case(name, "x</think>a</think>b", ("x", "a</think>b")),
        Case(name, "plan</think>done", ("plan", "done"), OFF),
        Case(name, "a<tool_call>b", ("a<tool_call>b", "")),
    ]


def _qwen(name: str, forced_always: bool = False) -> list[Case]:
    cases = [
        Case(name, "<think>The user wants 2+2.</think>\n\nThe answer is 4.",
             ("The user wants 2+2.", "\n\nThe answer is 4.")),
        Case(name, "The user wants 2+2.</think>\n\n4", ("The user wants 2+2.", "\n\n4")),
        Case(name, "<think>Need weather\n" + QWEN_TOOL, ("Need weather\n", QWEN_TOOL)),
        Case(name, "<think>a<tool_call>b</think>c", ("a", "<tool_call>b</think>c")),
        Case(name, "<think>Still", ("Still", "")),
        Case(name, "<think>only</think>", ("only", "")),
        Case(name, "<think><think>twice</think>x", ("twice", "x")),
    ]
    if forced_always:
        cases.append(Case(name, "plan</think>answer", ("plan", "answer"), OFF))
    else:
        cases += [
            Case(name, "The answer is 4.", ("", "The answer is 4."), OFF),
            Case(name, "Hi <think>x</think>y", ("x", "Hi y"), OFF),
        ]
    return cases


CASES: list[Case] = []
for _n in ("deepseek-r1", "step3", "step3p5", "gigachat35"):
    CASES += _r1(_n)
for _n in ("qwen3", "interns1", "dots", "nanbeige", "glm45", "nemotron_3"):
    CASES += _qwen(_n)
for _n in ("qwen3-thinking", "minimax"):
    CASES += _qwen(_n, forced_always=True)
CASES += [
    Case("dots", "Need to inspect inputs.</think>Final answer",
         ("Need to inspect inputs.", "Final answer")),
    Case("nanbeige", "Plan.</think>\n\nAnswer", ("Plan.", "\n\nAnswer")),
    Case("glm45", "<think>Check weather.</think>" + GLM_TOOL, ("Check weather.", GLM_TOOL)),
    Case("nemotron_3", "<think>x</think>y", ("x", "y")),
    # deepseek-v3: thinking opt-in (note the key `thinking`)
    Case("deepseek-v3", "Compute 2+2.</think>4", ("Compute 2+2.", "4"), TH_ON),
    Case("deepseek-v3", "4", ("", "4")),
    Case("deepseek-v3", "Compute 2+2.</think>4", ("", "Compute 2+2.</think>4"), ON),
    Case("deepseek-v3", "Long thought", ("Long thought", ""), TH_ON),
    Case("deepseek-v3", "<think>r</think>", ("r", ""), TH_ON),
    Case("deepseek-v3", "a\n" + QWEN_TOOL, ("a\n", QWEN_TOOL), TH_ON),
]
for _n in ("mimo", "poolside_v1"):
    CASES += [
        Case(_n, "<think>plan</think>done", ("plan", "done"), ON),
        Case(_n, "plan</think>done", ("plan", "done"), ON),
        Case(_n, "plain answer", ("", "plain answer")),
        Case(_n, "<think>plan</think>done", ("plan", "done")),
        Case(_n, "truncated", ("truncated", ""), ON),
        Case(_n, "<think>r</think>", ("r", ""), ON),
    ]
CASES += [
    Case("ling3", "<think>Just an answer</think>", ("", "Just an answer")),
    Case("ling3", "<think>hmm</think>Hello", ("hmm", "Hello")),
    Case("ling3", "Hello", ("", "Hello"), OFF),
    Case("ling3", "<think>hmm", ("", "hmm")),
    Case("ling3", "<think>use <tool_call> later</think>", ("use ", "<tool_call> later</think>")),
    Case("ling3", "<think>plan" + QWEN_TOOL, ("plan", QWEN_TOOL)),
    Case("ling3", "<think>r</think>", ("r", ""), {"force_nonempty_content": False}),
]
for _n in ("deepseek-v4", "deepseek-v41"):
    CASES += [
        Case(_n, "<think>plan the call</think>\n\nanswer", ("plan the call", "\n\nanswer")),
        Case(_n, "<think>need weather</think>\n\n" + DSML, ("need weather", "\n\n" + DSML)),
        Case(_n, "need weather" + DSML, ("need weather", DSML), TH_ON),
        Case(_n, "answer", ("", "answer")),
        Case(_n, "still going", ("still going", ""), TH_ON),
        Case(_n, "r</think>", ("r", ""), TH_ON),
    ]
CASES += [
    Case("granite_thinking_parser", "<think>reasoning</think>\nHello", ("reasoning", "Hello")),
    Case("granite_thinking_parser", "<think>reasoning</think>\n\n\nHello", ("reasoning", "Hello")),
    Case("granite_thinking_parser", "<think>r</think>c", ("r", "c")),
    Case("granite_thinking_parser", "<think>reasoning</think>\n\n", ("reasoning", "")),
    Case("granite_thinking_parser", "<think>truncated reasoning", ("truncated reasoning", "")),
    Case("granite_thinking_parser", "<think></think>\ncontent", ("", "content")),
    Case("granite_thinking_parser", "<think>think\n\n</think>\nresult", ("think\n\n", "result")),
    Case("granite_thinking_parser", "This is plain content", ("", "This is plain content"), OFF),
    Case("granite_thinking_parser", "<think>reasoning</think>\n<tool_call>fn</tool_call>",
         ("reasoning", "<tool_call>fn</tool_call>")),
    Case("granite_thinking_parser", "<think>truncated reasoning", ("", "truncated reasoning"),
         OFF),
    Case("granite_thinking_parser", "<think>r</think> \n x", ("r", " \n x")),
]
_IQ = "iquest_q1"
CASES += [
    Case(_IQ, "Reasoning.\n</think>\nAnswer.", ("Reasoning.\n", "\nAnswer.")),
    Case(_IQ, "<think>Reasoning.\n</think>\nAnswer.", ("Reasoning.\n", "\nAnswer.")),
    Case(_IQ, "prefix<think>work</think>answer", ("prefix<think>work", "answer")),
    Case(_IQ, "<iquest_tool_call>run</iquest_tool_call>",
         ("<iquest_tool_call>run</iquest_tool_call>", "")),
    Case(_IQ, "</think><iquest_tool_call>run</iquest_tool_call>",
         ("", "<iquest_tool_call>run</iquest_tool_call>")),
    Case(_IQ, "<think>work</thi", ("work</thi", "")),
    Case(_IQ, "answer", ("", "answer"), TH_OFF),
    Case(_IQ, "answer", ("", "answer"), OFF),
    Case(_IQ, "<think>work</think>answer", ("work", "answer"), TH_OFF),
    Case(_IQ, "w</think>a", ("w", "a"), {"thinking": False, "enable_thinking": True}),
    Case(_IQ, "w</think>a", ("w", "a"), {"enable_thinking": None}),
    Case(_IQ, "<think>work</think>answer: literal </think> tail",
         ("work", "answer: literal </think> tail")),
]
CASES += [
    Case("hunyuan", "Plan.</think>\nAnswer", ("Plan.", "\nAnswer"), effort="high"),
    Case("hunyuan", "Answer", ("", "Answer")),
    Case("hunyuan", "Answer", ("", "Answer"), effort="no_think"),
    Case("hunyuan", "Plan", ("Plan", ""), effort="low"),
    Case("hunyuan", "Plan<tool_calls>x", ("Plan", "<tool_calls>x"), effort="high"),
    Case("hunyuan", "<think>P</think>A", ("P", "A"), effort="none"),
    Case("hunyuan", "P</think:opensource>A<tool_calls:opensource>x",
         ("P", "A<tool_calls:opensource>x"), effort="high",
         template="{{ '<think:opensource>' }} <tool_calls:opensource>"),
    Case("kimi_k2", "<think>Let me check</think>Sure.", ("Let me check", "Sure.")),
    Case("kimi_k2", "<think>need tool<|tool_calls_section_begin|>…",
         ("need tool", "<|tool_calls_section_begin|>…")),
    Case("kimi_k2", "Sure.", ("", "Sure."), TH_OFF),
    Case("kimi_k2", "<think>hm", ("hm", "")),
    Case("kimi_k2", "r</think>", ("r", "")),
    Case("minimax-append-think", "plan</think>answer", ("", "<think>plan</think>answer")),
    Case("minimax-append-think", "answer", ("", "<think>answer"), OFF),
    Case("minimax-append-think", "plan", ("", "<think>plan")),
    Case("minimax-append-think", "", ("", "")),
    Case("kimi", "◁think▷hmm◁/think▷Hello", ("hmm", "Hello")),
    Case("kimi", "Hello", ("", "Hello")),
    Case("kimi", "hmm◁/think▷Hello", ("", "hmm◁/think▷Hello"), ON),
    Case("kimi", "◁think▷hm", ("hm", "")),
    Case("kimi", "◁think▷hm◁/think▷", ("hm", "")),
    Case("minimax-m3", "plan</mm:think>Answer", ("plan", "Answer"), {"thinking_mode": "enabled"}),
    Case("minimax-m3", "</mm:think>Answer", ("", "Answer")),
    Case("minimax-m3", "\n </mm:think>Answer", ("", "\n Answer")),
    Case("minimax-m3", "Answer</mm:think>", ("", "Answer</mm:think>")),
    Case("minimax-m3", "plan", ("plan", ""), {"thinking_mode": "enabled"}),
    Case("minimax-m3", "<mm:think>x</mm:think>y", ("x", "y")),
    Case("minimax-m3", "<mm:think>x</mm:think>", ("x", ""), {"thinking_mode": "enabled"}),
    Case("mistral", "[THINK]Consider…[/THINK]The answer.", ("Consider…", "The answer.")),
    Case("mistral", "Consider[/THINK]ans", ("Consider", "ans"), effort="high"),
    Case("mistral", "ans", ("", "ans")),
    Case("mistral", "ans", ("", "ans"), effort="none"),
    Case("mistral", "[THINK]hm", ("hm", "")),
    Case("mistral", "[THINK]hm[/THINK]", ("hm", "")),
    Case("gemma4", "<|channel>thought\nUser asks 2+2.<channel|>4", ("User asks 2+2.", "4")),
    Case("gemma4", "4", ("", "4")),
    Case("gemma4", "x<channel|>y", ("x", "y"), ON),
    Case("gemma4", "<|channel>thought\nhm", ("hm", "")),
    Case("gemma4", "<|channel>thought\nr<channel|>", ("r", "")),
    Case("gemma4", "<|channel>thought\n<channel|>plain", ("", "plain")),
]
CASES += [
    Case("apertus2509", "<|inner_prefix|>Need weather.<|inner_suffix|>Checking." + APERTUS_CALL,
         ("Need weather.", "Checking." + APERTUS_CALL)),
    Case("apertus2509", '<|inner_prefix|>a<|tools_prefix|>[{"get_time": {"tz": "UTC"}}]'
         "<|tools_suffix|>b<|inner_suffix|>done",
         ("ab", '<|tools_prefix|>[{"get_time": {"tz": "UTC"}}]<|tools_suffix|>done')),
    Case("apertus2509", "Hello", ("", "Hello"), ON),
    Case("apertus2509", "<|inner_prefix|>hm", ("hm", "")),
    Case("apertus2509", "<|inner_prefix|>r<|inner_suffix|>", ("r", "")),
    Case("apertus2509", "<|inner_prefix|>a<|inner_suffix|>x<|inner_prefix|>b<|inner_suffix|>y",
         ("ab", "xy")),
    Case("cohere_command4", "Look up.<|END_THINKING|><|START_TEXT|>It is sunny.<|END_TEXT|>",
         ("Look up.", "It is sunny.")),
    Case("cohere_command4", "<|START_TEXT|>Hi<|END_TEXT|>", ("", "Hi")),
    Case("cohere_command4", "Need tool.<|END_THINKING|>" + COHERE_ACTION,
         ("Need tool.", COHERE_ACTION)),
    Case("cohere_command4", "Thinking", ("Thinking", ""), OFF),
    Case("cohere_command4", "<|START_THINKING|>T<|END_THINKING|><|START_TEXT|>A", ("T", "A")),
    Case("cohere_command4", "T<|END_THINKING|>", ("T", "")),
    Case("gpt-oss", "<|channel|>analysis<|message|>User asks weather.<|end|><|start|>assistant"
         "<|channel|>final<|message|>It is sunny.<|return|>",
         ("User asks weather.", "It is sunny.")),
    Case("gpt-oss", "<|channel|>analysis<|message|>Need tool.<|end|>" + HARMONY_CALL,
         ("Need tool.", HARMONY_CALL)),
    Case("gpt-oss", "Hello", ("", "Hello")),
    Case("gpt-oss", "<|channel|>analysis<|message|>thinking...", ("thinking...", "")),
    Case("gpt-oss", "<|channel|>analysis<|message|>r<|end|>", ("r", "")),
    Case("gpt-oss", "<|channel|>weird<|message|>x<|end|><|start|>assistant<|channel|>final"
         "<|message|>y<|return|>", ("", "y")),
    Case("gpt-oss", "<|channel|>commentary<|message|>One sec.<|end|>", ("", "One sec.")),
    Case("gpt-oss", "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}"
         "<|call|>", ("", "<|start|>assistant<|channel|>commentary to=functions.get_time "
                      "<|constrain|>json<|message|>{}<|call|>")),
    Case("kimi_k3", "<|open|>think<|sep|>Check.<|close|>think<|sep|><|open|>response<|sep|>"
         "Sunny.<|close|>response<|sep|>", ("Check.", "Sunny.")),
    Case("kimi_k3", "Check.<|close|>think<|sep|>" + K3_TOOLS, ("Check.", K3_TOOLS)),
    Case("kimi_k3", "<|open|>response<|sep|>Checking.<|close|>response<|sep|>" + K3_TOOLS,
         ("", "Checking." + K3_TOOLS), TH_OFF),
    Case("kimi_k3", "Hello", ("", "Hello"), TH_OFF),
    Case("kimi_k3", "Check.<|open|>respo", ("Check.", "")),
    Case("kimi_k3", "Check.<|close|>", ("Check.", "")),
    Case("kimi_k3", "Check. <|", ("Check. <|", "")),
    Case("kimi_k3", "<|open|>think<|sep|>r<|close|>think<|sep|>", ("r", "")),
    Case("kimi_k3", "Plan<|open|>response<|sep|>Sunny.<|close|>message<|sep|>", ("Plan", "Sunny.")),
    Case("kimi_k3", "Sunny.<|close|>response<|sep|>", ("", "Sunny."),
         {"force_nonempty_content": True}),
    Case("k2_horizon", "Plan it.</ifm|think>\nThe answer.", ("Plan it.", "\nThe answer."),
         effort="high"),
    Case("k2_horizon", "P</ifm|think_fast>A", ("P", "A")),
    Case("k2_horizon", "P</ifm|think_faster>A", ("P", "A"), effort="low"),
    Case("k2_horizon", "P</ifm|think>A", ("P", "A"), {"reasoning_effort": "high"}, "low"),
    Case("k2_horizon", "P</ifm|think_fast>A", ("P", "A"), effort="xhigh"),
    Case("k2_horizon", "P<ifm|tool_calls>x", ("P", "<ifm|tool_calls>x")),
    Case("k2_horizon", "P", ("P", "")),
    Case("k2_horizon", "<ifm|think_fast>P</ifm|think_fast>", ("P", ""), OFF),
    Case("inkling", "<|message_model|><|content_thinking|>plan<|end_message|><|message_model|>"
         "<|content_text|>Answer<|end_message|><|content_model_end_sampling|>", ("plan", "Answer")),
    Case("inkling", "Just text", ("", "Just text")),
    Case("inkling", "<|message_model|><|content_thinking|>plan<|end_message|>" + INK_CALL,
         ("plan", INK_CALL)),
    Case("inkling", "<|message_model|><|content_thinking|>pl", ("pl", "")),
    Case("inkling", "<|content_thinking|>r<|end_message|>", ("r", "")),
    Case("muse", " to=self<|message|>alpha<|eom|><|start|>assistant to=user<|message|>done<|eot|>",
         ("alpha", "done")),
    Case("muse", "<|start|>assistant to=self<|message|>first<|eom|><|start|>assistant to=self"
         "<|message|>second<|eom|>", ("first\nsecond", "")),
    Case("muse", "Hello there", ("", "Hello there")),
    Case("muse", "One sec. " + MUSE_CALL, ("", "One sec. " + MUSE_CALL)),
    Case("muse", " to=self<|message|>plan<|eom|>" + MUSE_CALL, ("plan", MUSE_CALL)),
    Case("muse", " to=se", ("", " to=se")),
    Case("muse", " to=self<|message|>thin", ("thin", "")),
    Case("muse", "Hi to=self<|message|>x", ("", "Hi to=self<|message|>x")),
    Case("muse", "<|message|>answer<|eot|> tail", ("", "answer tail")),
]


# --------------------------------------------------------------------------- helpers


@lru_cache(maxsize=None)
def factory(name: str, template: str | None = None):
    return parser_factory("reasoning_parser", name, chat_template=template)


def make(case: Case):
    return factory(case.name, case.template)(chat_template_kwargs=dict(case.kwargs),
                                            reasoning_effort=case.effort)


def stream(parser, chunks) -> ReasoningDelta:
    r, c = [], []
    for d in [*(parser.feed(ch) for ch in chunks), parser.finish()]:
        r.append(d.reasoning)
        c.append(d.content)
    return ReasoningDelta("".join(r), "".join(c))


def chunkings(text: str, seed: int = 0):
    rng = random.Random(seed)
    yield from ([text[:i], text[i:]] for i in range(len(text) + 1))
    yield list(text)
    for _ in range(5):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            pieces.append(text[i:i + n])
            i += n
        yield pieces


def case_id(case: Case) -> str:
    extra = f"-{case.kwargs}" if case.kwargs else ""
    extra += f"-effort={case.effort}" if case.effort else ""
    return f"{case.name}:{case.text[:30]!r}{extra}"


# --------------------------------------------------------------------------- the table


def test_every_name_has_cases():
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="engine.reasoning_parser")}
    assert len(names) >= 35
    covered = {c.name for c in CASES} | {"auto"}
    assert names - covered == set()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_whole(case: Case):
    got = make(case).parse(case.text)
    assert (got.reasoning, got.content) == case.expected


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_streamed_equals_whole(case: Case):
    whole = make(case).parse(case.text)
    for chunks in chunkings(case.text):
        parser = make(case)
        got = stream(parser, chunks)
        assert parser.stream_matches(whole, got), (chunks, got, whole)
        if not parser.force_nonempty_content:
            assert got == whole, chunks


# --------------------------------------------------------------------------- documented asymmetries

ASYMMETRIC = [
    # (case, what a stream yields)
    (Case("granite_thinking_parser", "<think>truncated reasoning", ("", "truncated reasoning"),
          OFF), ("truncated reasoning", "truncated reasoning")),
    (Case("ling3", "<think>Just an answer</think>", ("", "Just an answer")),
     ("Just an answer", "")),
    (Case("qwen3", "<think>r</think>", ("", "r"), {"force_nonempty_content": True}), ("r", "r")),
    (Case("kimi_k3", "Sunny.<|close|>response<|sep|>", ("", "Sunny."),
          {"force_nonempty_content": True}),
     ("Sunny.", "Sunny.")),  # the closes are framing, never reasoning text
]


@pytest.mark.parametrize("case,streamed", ASYMMETRIC, ids=lambda x: getattr(x, "name", ""))
def test_force_nonempty_asymmetry(case: Case, streamed):
    whole = make(case).parse(case.text)
    assert (whole.reasoning, whole.content) == case.expected
    for chunks in chunkings(case.text):
        assert tuple(vars(stream(make(case), chunks)).values()) == streamed, chunks


def test_iquest_literal_close_after_answer_streams_as_content():
    parser = factory("iquest_q1")(chat_template_kwargs={}, reasoning_effort=None)
    first = parser.feed("<think>work</think>answer:")
    second = parser.feed("literal </think> tail")
    assert (first.reasoning, first.content) == ("work", "answer:")
    assert (second.reasoning, second.content) == ("", "literal </think> tail")


def test_tool_start_closes_reasoning_at_once_in_a_stream():
    """The call streams as soon as its marker arrives (not held to a later ``</think>``)."""
    parser = factory("qwen3")(chat_template_kwargs={}, reasoning_effort=None)
    first = parser.feed("<think>a<tool_call>b")
    assert (first.reasoning, first.content) == ("a", "<tool_call>b")
    late = parser.feed("</think>c")
    assert (late.reasoning, late.content) == ("", "</think>c")


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_stream_reasoning_off_buffers_until_close(stream_reasoning):
    f = ParserFactory("t", options={"stream_reasoning": stream_reasoning}, policy="always",
                      template_overrides=False)
    parser = f(chat_template_kwargs={}, reasoning_effort=None)
    deltas = [parser.feed(ch) for ch in ("abc", "def", "</think>", "xy")] + [parser.finish()]
    reasonings = [d.reasoning for d in deltas]
    if stream_reasoning:
        assert reasonings == ["abc", "def", "", "", ""]
    else:
        assert reasonings == ["", "", "abcdef", "", ""]
    assert "".join(d.content for d in deltas) == "xy"


def test_stream_reasoning_off_flushes_truncated_reasoning_at_finish():
    parser = TagReasoningParser(force_reasoning=True, stream_reasoning=False)
    assert not parser.feed("abc")
    assert parser.finish() == ReasoningDelta("abc", "")


@pytest.mark.parametrize("template,start,end", [
    (None, "<think>", "</think>"),
    ("x {{ '<think:opensource>' }} y", "<think:opensource>", "</think:opensource>"),
])
def test_hunyuan_markers_from_template(template, start, end):
    parser = factory("hunyuan", template)(chat_template_kwargs={}, reasoning_effort="high")
    assert (parser.start, parser.end, parser.force_reasoning) == (start, end, True)


def test_muse_keep_user_framing_option():
    f = parser_factory("reasoning_parser", "muse", options={"muse_keep_user_framing": True},
                     chat_template=None)
    got = f(chat_template_kwargs={}, reasoning_effort=None).parse(
        " to=self<|message|>a<|eom|><|start|>assistant to=user<|message|>b<|eot|>")
    assert got == ReasoningDelta("a", "<|start|>assistant to=user<|message|>b<|eot|>")


# --------------------------------------------------------------------------- policies

POLICY_TABLE = [
    ("always", {}, None, True),
    ("never", {"enable_thinking": True}, "high", False),
    ("enable_thinking", {}, None, True),
    ("enable_thinking", {"enable_thinking": False}, None, False),
    ("enable_thinking", {"enable_thinking": None}, None, True),
    ("thinking", {"thinking": False}, None, False),
    ("thinking", {"enable_thinking": False}, None, True),
    ("explicit_enable_thinking", {}, None, False),
    ("explicit_enable_thinking", {"enable_thinking": True}, None, True),
    ("explicit_thinking", {"thinking": True}, None, True),
    ("explicit_thinking", {"enable_thinking": True}, None, False),
    ("effort_given", {}, None, False),
    ("effort_given", {}, "none", False),
    ("effort_given", {}, "high", True),
    ("effort_not_off", {}, None, False),
    ("effort_not_off", {}, "no_think", False),
    ("effort_not_off", {}, "none", False),
    ("effort_not_off", {}, "low", True),
    ("thinking_mode_enabled", {"thinking_mode": "enabled"}, None, True),
    ("thinking_mode_enabled", {"thinking_mode": "disabled"}, None, False),
    ("thinking_mode_enabled", {}, "high", False),
    # IQuest: thinking and enable_thinking are aliases (fact sheet table)
    ("either_toggle", {}, None, True),
    ("either_toggle", {"thinking": False}, None, False),
    ("either_toggle", {"enable_thinking": False}, None, False),
    ("either_toggle", {"thinking": False, "enable_thinking": True}, None, True),
    ("either_toggle", {"thinking": True, "enable_thinking": False}, None, True),
    ("either_toggle", {"enable_thinking": None}, None, True),
    ("either_toggle", {"thinking": False, "enable_thinking": None}, None, False),
    ("either_toggle", {"thinking": None, "enable_thinking": False}, None, False),
]


@pytest.mark.parametrize("policy,kwargs,effort,on", POLICY_TABLE)
def test_policy(policy, kwargs, effort, on):
    assert POLICIES[policy].enabled(kwargs, effort) is on


QWEN3_TPL = ("{%- if enable_thinking is defined and enable_thinking is false %}"
             "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
TEMPLATES = [
    # (template, template policy, detected parser)
    (None, None, None),
    ("{{ messages }}", None, None),
    (QWEN3_TPL, "enable_thinking", "qwen3"),
    ("{%- if not enable_thinking is defined %}{%- set enable_thinking = false %}{%- endif %}"
     "<think>", "explicit_enable_thinking", "mimo"),
    ("{{ enable_thinking | default(false) }}<arg_key><arg_value>", "explicit_enable_thinking",
     "poolside_v1"),
    ("{{- '<|im_start|>assistant\\n<think>\\n' }}", "always", "deepseek-r1"),
    ("{%- if not thinking is defined %}{%- set thinking = false %}{%- endif %}<think>",
     "explicit_thinking", "deepseek-v3"),
    ("<|start|>assistant<|channel|>final<|message|>", "always", "gpt-oss"),
    ("{{ reasoning_effort }}[THINK]", "effort_given", "mistral"),
    ("<|turn>model\n<|channel>thought\n<channel|>", None, "gemma4"),
    ("◁think▷", None, "kimi"),
    ("<|tool_calls_section_begin|>", None, "kimi_k2"),
    ("<|inner_prefix|>", None, "apertus2509"),
    ("<ifm|think><ifm|tool_calls><ifm|tool_call>", None, "k2_horizon"),
    ("<mm:think>", None, "minimax-m3"),
    ("<minimax:tool_call>", None, "minimax"),
    ("Step-3.5 {{ x }}", None, "step3p5"),
    ("<steptml:invoke", None, "step3"),
    ("<｜DSML｜ calls>", None, "deepseek-v41"),
    ("<｜DSML｜tool_calls>", None, "deepseek-v4"),
    ("<tool_calls><tool_sep>", None, "hunyuan"),
    ("[gMASK]<sop><|user|><tool_call>" + QWEN3_TPL, "enable_thinking", "glm45"),
    ("truncate_history_thinking " + QWEN3_TPL, "enable_thinking", "nemotron_3"),
    ("truncate_history_thinking defer_loading " + QWEN3_TPL, "enable_thinking",
     "granite_thinking_parser"),
    ("default_thinking_sys " + QWEN3_TPL, "enable_thinking", "interns1"),
    ("<role>SYSTEM</role><role>ASSISTANT</role><|role_end|><arg_key><arg_value>", None, "ling3"),
    ("</think>", None, "deepseek-r1"),
]


@pytest.mark.parametrize("template,policy,picked", TEMPLATES)
def test_template_detection(template, policy, picked):
    assert template_policy(template) == (POLICIES[policy] if policy else None)
    assert detect_reasoning_parser(template) == picked


@pytest.mark.parametrize("template,picked", [(t, p) for t, _, p in TEMPLATES])
def test_auto_delegates(template, picked):
    f = factory("auto", template)
    assert repr(f) == f"AutoReasoningFactory(picked={picked!r})"
    got = f(chat_template_kwargs={}, reasoning_effort=None).parse("<think>a</think>b")
    if picked is None:
        assert got == ReasoningDelta("", "<think>a</think>b")
    else:
        expected = factory(picked, template)(chat_template_kwargs={}, reasoning_effort=None)
        assert got == expected.parse("<think>a</think>b")


def test_template_forcing_reaches_explicit_parser():
    # a Qwen3-2507 Thinking template opens <think> itself: qwen3 is forced even with the toggle off
    tpl = "{{- '<|im_start|>assistant\\n<think>\\n' }}"
    parser = factory("qwen3", tpl)(chat_template_kwargs=OFF, reasoning_effort=None)
    assert parser.parse("plan</think>x") == ReasoningDelta("plan", "x")


# --------------------------------------------------------------------------- helpers and speed


@pytest.mark.parametrize("text,markers,n", [
    ("abc<thi", ("<think>",), 4), ("abc<think>", ("<think>",), 0), ("abc", ("<think>",), 0),
    ("a<|x", ("<|x|>", "<|xy|>"), 3), ("<", ("<a>", "<b>"), 1), ("", ("<a>",), 0),
])
def test_partial_tail(text, markers, n):
    assert partial_tail(text, markers) == n


WORDS = "the weather in Paris is mild; consider <b>options</b> and 3 < 4 > 2. " * 100


def _long_response(name: str) -> str:
    """About 4,000 tokens of reasoning and answer with 8 tool calls, in the parser's format."""
    if name == "gpt-oss":
        body = f"<|channel|>analysis<|message|>{WORDS}<|end|>"
        body += f"<|start|>assistant<|channel|>final<|message|>{WORDS}<|end|>"
        for i in range(8):
            body += HARMONY_CALL.replace("Paris", f"P{i}")
        return body
    body = "<think>" + WORDS + "</think>" + WORDS
    for i in range(8):
        body += QWEN_TOOL.replace("Paris", f"P{i}") + WORDS[:200]
    return body


@pytest.mark.parametrize("name", ["qwen3", "gpt-oss", "muse", "inkling", "kimi_k3",
                                  "cohere_command4", "apertus2509", "granite_thinking_parser"])
def test_streaming_cost_per_chunk(name):
    text = _long_response(name)
    chunks = [text[i:i + 4] for i in range(0, len(text), 4)]
    parser = factory(name)(chat_template_kwargs={}, reasoning_effort=None)
    t0 = time.perf_counter()
    for ch in chunks:
        parser.feed(ch)
    parser.finish()
    per_chunk = (time.perf_counter() - t0) / len(chunks)
    assert len(chunks) >= 3500  # ~4,000 tokens of ~3.5-4 characters
    assert per_chunk < 50e-6, f"{per_chunk * 1e6:.1f} us per chunk"
