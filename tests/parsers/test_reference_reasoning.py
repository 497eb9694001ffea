"""Reasoning behaviours that SGLang's own reasoning-parser tests pin down, held here with our own
fixtures: forcing (thinking on by default, parsers that always or never think), a close marker
without its open marker, partial markers held and released, tool-start markers closing
reasoning, ``force_nonempty_content``, buffered reasoning (``stream_reasoning`` off), continued
messages, reasoning effort and the toggles, ``separate_reasoning`` off; then the channel formats
(Harmony, Muse Glimmer, Apertus, Cohere) and the Muse, MiniCPM5 and Ling tool pipelines.

Every case is checked whole and streamed one character at a time. The two must agree, except
for the documented ``force_nonempty_content`` asymmetry (a stream has already sent the
reasoning, so at its end it sends the same text again as content).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.assembly import parser_factory
from engine.parsers.api import MessageStream, assemble, parse_message
from engine.testing.tools import strict_json_object


def split(msg: dict[str, Any]) -> tuple[str, str, list[tuple[str, Any]]]:
    return (msg["reasoning_content"] or "", msg["content"] or "",
            [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in msg["tool_calls"]])


def both(text: str, *, swapped: bool = False, **kw: Any) -> tuple[str, str, list]:
    """``(reasoning, content, calls)`` of the whole parse, after checking that a one-character
    stream gives the same. ``swapped``: the whole parse moved the reasoning into the content
    (``force_nonempty_content``), so the stream gives the reasoning and then that content."""
    whole = parse_message(text, **kw)
    for c in whole["tool_calls"]:
        assert strict_json_object(c["function"]["arguments"]), c
    stream = MessageStream(**kw)
    streamed = split(assemble([*(stream.feed(ch) for ch in text), stream.finish()]))
    reasoning, content, calls = split(whole)
    if swapped:
        assert not reasoning and streamed == (content, content, calls), streamed
    else:
        assert streamed == (reasoning, content, calls), streamed
    return reasoning, content, calls


def rc(text: str, parser: str, **kw: Any) -> tuple[str, str]:
    """``(reasoning, content)`` of a reasoning parser alone."""
    reasoning, content, _ = both(text, reasoning_parser=parser, **kw)
    return reasoning, content


OFF = {"enable_thinking": False}
NONEMPTY = {"force_nonempty_content": True}


# --------------------------------------------------------------------------- the tag splitter

def test_whitespace_inside_and_after_reasoning_is_kept():
    text = "<think>\nweigh the options\n</think>\n\nTake the train.\n"
    assert rc(text, "qwen3") == ("\nweigh the options\n", "\n\nTake the train.\n")


def test_repeated_leading_open_markers_are_framing():
    assert rc("<think><think>weigh it</think>Go.", "qwen3") == ("weigh it", "Go.")


def test_an_empty_reasoning_block_leaves_only_the_answer():
    assert rc("<think></think>Go by train.", "qwen3", chat_template_kwargs=OFF) == (
        "", "Go by train.")


@pytest.mark.parametrize("parser", ["qwen3", "glm45", "nemotron_3", "interns1", "dots"])
def test_thinking_on_by_default_reads_a_close_without_its_open(parser):
    """The template opens reasoning in the prompt: the output starts inside it."""
    assert rc("the user wants a route</think>Take the train.", parser) == (
        "the user wants a route", "Take the train.")


@pytest.mark.parametrize("parser", ["qwen3", "glm45", "nemotron_3"])
def test_thinking_off_leaves_plain_text_as_content(parser):
    assert rc("Take the train.", parser, chat_template_kwargs=OFF) == ("", "Take the train.")


@pytest.mark.parametrize("parser", ["deepseek-r1", "qwen3-thinking", "minimax", "step3", "step3p5"])
@pytest.mark.parametrize("kwargs", [None, OFF])
def test_always_thinking_parsers_ignore_the_toggle(parser, kwargs):
    assert rc("still weighing routes", parser, chat_template_kwargs=kwargs) == (
        "still weighing routes", "")
    assert rc("weighing</think>Train.", parser, chat_template_kwargs=kwargs) == (
        "weighing", "Train.")
    assert rc("<think>weighing</think>Train.", parser, chat_template_kwargs=kwargs) == (
        "weighing", "Train.")


@pytest.mark.parametrize("text", ["<th", "<thin", "</", "</answer", "<this is text", "< / random>"])
def test_an_unfinished_marker_comes_back_as_text(text):
    assert rc(text, "qwen3", chat_template_kwargs=OFF) == ("", text)


def test_a_close_marker_cut_by_the_end_stays_in_the_reasoning():
    assert rc("<think>weighing</thi", "qwen3") == ("weighing</thi", "")


# --------------------------------------------------------------------------- tool starts

@pytest.mark.parametrize("parser,call", [
    ("glm45", "<tool_call>lookup"),
    ("qwen3", "<tool_call>lookup"),
    ("ling3", "<tool_call>lookup</tool_call>"),
    ("nemotron_3", "<tool_call>lookup"),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>"),
])
def test_a_call_marker_closes_unfinished_reasoning(parser, call):
    assert rc("<think>need the schedule" + call, parser) == ("need the schedule", call)


def test_reasoning_closes_at_the_first_of_several_call_markers():
    text = "<think>plan<tool_call>one<tool_call>two<tool_call>three"
    assert rc(text, "glm45") == ("plan", "<tool_call>one<tool_call>two<tool_call>three")


def test_a_call_right_after_the_open_marker_leaves_no_reasoning():
    assert rc("<think><tool_call>lookup", "glm45") == ("", "<tool_call>lookup")


def test_hunyuan_calls_close_reasoning_with_their_plural_marker():
    text = "<think>check first<tool_calls><tool_call>lookup<tool_sep></tool_call></tool_calls>"
    assert rc(text, "hunyuan") == ("check first", text[len("<think>check first"):])


def test_iquest_has_no_call_marker_so_a_call_needs_the_close():
    call = "<iquest_tool_call>run</iquest_tool_call>"
    assert rc(call, "iquest_q1") == (call, "")
    assert rc("</think>" + call, "iquest_q1") == ("", call)


# --------------------------------------------------------------------------- other markers

def test_kimi_uses_its_own_markers_and_never_starts_inside_reasoning():
    assert rc("◁think▷weigh routes◁/think▷Train.", "kimi") == ("weigh routes", "Train.")
    assert rc("Train, no thinking.", "kimi") == ("", "Train, no thinking.")
    assert rc("◁thi", "kimi") == ("", "◁thi")


@pytest.mark.parametrize("kwargs", [None, {"enable_thinking": True}])
def test_gemma4_opens_with_a_labelled_channel(kwargs):
    assert rc("<|channel>thought\nweigh routes<channel|>Train.", "gemma4",
              chat_template_kwargs=kwargs) == ("weigh routes", "Train.")
    assert rc("<|channel>thought\nstill weighing", "gemma4", chat_template_kwargs=kwargs) == (
        "still weighing", "")


def test_gemma4_with_thinking_on_starts_inside_reasoning():
    assert rc("weigh routes<channel|>Train.", "gemma4",
              chat_template_kwargs={"enable_thinking": True}) == ("weigh routes", "Train.")
    assert rc("Train.", "gemma4") == ("", "Train.")


@pytest.mark.parametrize("kwargs,forced", [
    ({"thinking_mode": "enabled"}, True), ({"thinking_mode": "disabled"}, False), (None, False)])
def test_minimax_m3_thinks_only_when_thinking_mode_is_enabled(kwargs, forced):
    expected = ("plan", "Train.") if forced else ("", "plan</mm:think>Train.")
    assert rc("plan</mm:think>Train.", "minimax-m3", chat_template_kwargs=kwargs) == expected


@pytest.mark.parametrize("effort,forced", [
    (None, False), ("none", False), ("no_think", False), ("low", True), ("high", True)])
def test_hunyuan_thinks_when_a_reasoning_effort_is_set(effort, forced):
    expected = ("Plan.", "\nTrain.") if forced else ("", "Plan.</think>\nTrain.")
    assert rc("Plan.</think>\nTrain.", "hunyuan", reasoning_effort=effort) == expected
    assert rc("<think>Plan.</think>Train.", "hunyuan", reasoning_effort=effort) == (
        "Plan.", "Train.")


def test_minimax_append_think_splits_nothing_and_restores_the_open_marker():
    assert rc("weigh routes</think>Train.", "minimax-append-think") == (
        "", "<think>weigh routes</think>Train.")


# --------------------------------------------------------------------------- nonempty content

@pytest.mark.parametrize("text,reasoning", [
    ("<think>only reasoning, no answer</think>", "only reasoning, no answer"),
    ("<think>cut before the close", "cut before the close"),
])
def test_force_nonempty_content_moves_a_lone_reasoning_into_content(text, reasoning):
    assert rc(text, "nemotron_3", chat_template_kwargs=NONEMPTY, swapped=True) == ("", reasoning)


def test_force_nonempty_content_keeps_a_real_answer_and_plain_text():
    assert rc("<think>why</think>Train.", "nemotron_3", chat_template_kwargs=NONEMPTY) == (
        "why", "Train.")
    assert rc("Plain answer.", "nemotron_3",
              chat_template_kwargs={**NONEMPTY, **OFF}) == ("", "Plain answer.")


def test_cohere_force_nonempty_content_uses_the_thinking_as_the_answer():
    assert rc("only thinking<|END_THINKING|>", "cohere_command4", chat_template_kwargs=NONEMPTY,
              swapped=True) == ("", "only thinking")


def test_ling3_moves_a_lone_reasoning_into_content_when_parsed_whole():
    """Ling-3 turns the swap on by default for whole responses only: a stream keeps its
    reasoning (nothing is sent again at the end)."""
    whole = parse_message("<think>the answer</think>", reasoning_parser="ling3")
    assert (whole["reasoning_content"], whole["content"]) == (None, "the answer")
    stream = MessageStream(reasoning_parser="ling3")
    streamed = assemble([*(stream.feed(ch) for ch in "<think>the answer</think>"),
                         stream.finish()])
    assert (streamed["reasoning_content"], streamed["content"]) == ("the answer", None)


def test_ling3_keeps_its_reasoning_with_an_answer_a_call_or_the_swap_off():
    assert rc("<think>why</think>Train.", "ling3") == ("why", "Train.")
    assert rc("<think>need the date<tool_call>date</tool_call>", "ling3") == (
        "need the date", "<tool_call>date</tool_call>")
    assert rc("<think>the answer</think>", "ling3",
              chat_template_kwargs={"force_nonempty_content": False}) == ("the answer", "")


GRANITE = [
    ("<think>weigh</think>\nTrain.", None, ("weigh", "Train.")),
    ("<think>weigh</think>\n\n\nTrain.", None, ("weigh", "Train.")),
    ("<think>w</think>t", None, ("w", "t")),
    ("<think>weigh</think>", None, ("weigh", "")),
    ("<think>weigh</think>\n\n", None, ("weigh", "")),
    ("<think>weigh</think>\n\n", NONEMPTY, ("weigh", "")),
    ("<think>weigh</think>\nTrain.", NONEMPTY, ("weigh", "Train.")),
    ("<think>cut short", None, ("cut short", "")),
    ("<think>line one\nline two</think>\nstep one\nstep two", None,
     ("line one\nline two", "step one\nstep two")),
    ("<think></think>Train.", None, ("", "Train.")),
    ("<think></think>\nTrain.", None, ("", "Train.")),
    ("<think></think>\n\nTrain.", None, ("", "Train.")),
    ("Plain answer.", OFF, ("", "Plain answer.")),
    ("<think></think>Train.", OFF, ("", "Train.")),
    ("<think>weigh\n\n</think>\nTrain.", None, ("weigh\n\n", "Train.")),
    ("<think>w</think>\n", None, ("w", "")),
    ("<think>w</think>\n\nTrain.", NONEMPTY, ("w", "Train.")),
    ("<think>weigh</think>\n<tool_call>lookup</tool_call>", None,
     ("weigh", "<tool_call>lookup</tool_call>")),
]


@pytest.mark.parametrize("text,kwargs,expected", GRANITE)
def test_granite_trims_the_newlines_that_open_its_answer(text, kwargs, expected):
    """Content written only as newlines is trimmed to nothing, and still counts as an answer:
    ``force_nonempty_content`` swaps only a response that wrote no answer at all."""
    assert rc(text, "granite_thinking_parser", chat_template_kwargs=kwargs) == expected


def test_granite_swaps_cut_reasoning_when_nonempty_content_is_asked():
    assert rc("<think>cut short", "granite_thinking_parser", chat_template_kwargs=NONEMPTY,
              swapped=True) == ("", "cut short")


def test_granite_turning_thinking_off_asks_for_nonempty_content():
    assert rc("<think>weigh</think>", "granite_thinking_parser", chat_template_kwargs=OFF,
              swapped=True) == ("", "weigh")


# --------------------------------------------------------------------------- IQuest toggles

@pytest.mark.parametrize("kwargs,on", [
    ({}, True),
    ({"thinking": False}, False),
    ({"enable_thinking": False}, False),
    ({"thinking": False, "enable_thinking": True}, True),
    ({"thinking": True, "enable_thinking": False}, True),
    ({"enable_thinking": None}, True),
    ({"thinking": False, "enable_thinking": None}, False),
    ({"thinking": None, "enable_thinking": False}, False),
])
def test_iquest_toggles_are_aliases(kwargs, on):
    expected = ("work", "answer") if on else ("", "work</think>answer")
    assert rc("work</think>answer", "iquest_q1", chat_template_kwargs=kwargs) == expected


@pytest.mark.parametrize("prefix", ["", "<think>"])
def test_iquest_reads_a_prefilled_or_written_open_marker_alike(prefix):
    assert rc(prefix + "Reasoning.\n</think>\nAnswer.", "iquest_q1") == (
        "Reasoning.\n", "\nAnswer.")


def test_iquest_with_thinking_off_still_splits_a_written_block():
    kw = {"thinking": False}
    assert rc("answer", "iquest_q1", chat_template_kwargs=kw) == ("", "answer")
    assert rc("<think>work</think>answer", "iquest_q1", chat_template_kwargs=kw) == (
        "work", "answer")


def test_iquest_only_a_leading_open_marker_is_framing():
    assert rc("prefix<think>work</think>answer", "iquest_q1") == ("prefix<think>work", "answer")


def test_a_close_marker_after_the_answer_began_is_literal():
    assert rc("<think>work</think>answer: literal </think> tail", "iquest_q1") == (
        "work", "answer: literal </think> tail")


# --------------------------------------------------------------------------- buffered reasoning

def unstreamed(name: str) -> Any:
    return parser_factory("reasoning_parser", name, options={"stream_reasoning": False})


@pytest.mark.parametrize("name,text,reasoning,content", [
    ("qwen3", "<think>weigh routes</think>Train.", "weigh routes", "Train."),
    ("glm45", "<think>weigh<tool_call>lookup", "weigh", "<tool_call>lookup"),
    ("apertus2509", "<|inner_prefix|>weigh<|inner_suffix|>Train.", "weigh", "Train."),
    ("cohere_command4", "weigh<|END_THINKING|><|START_TEXT|>Train.<|END_TEXT|>", "weigh",
     "Train."),
    ("muse", " to=self<|message|>weigh<|eom|><|start|>assistant to=user<|message|>Train.<|eot|>",
     "weigh", "Train."),
])
def test_buffered_reasoning_arrives_in_one_piece_when_it_closes(name, text, reasoning, content):
    stream = MessageStream(reasoning_parser=unstreamed(name))
    pieces = [d["reasoning_content"] for d in (stream.feed(ch) for ch in text)
              if d.get("reasoning_content")]
    tail = stream.finish()
    assert pieces == [reasoning] and not tail.get("reasoning_content")
    assert rc(text, unstreamed(name)) == (reasoning, content)


@pytest.mark.parametrize("name,text,reasoning", [
    ("qwen3", "<think>cut short", "cut short"),
    ("iquest_q1", "<think>work</thi", "work</thi"),
    ("apertus2509", "<|inner_prefix|>cut short", "cut short"),
    ("cohere_command4", "cut short", "cut short"),
    ("muse", " to=self<|message|>cut short", "cut short"),
])
def test_buffered_reasoning_cut_by_the_end_is_released_at_the_end(name, text, reasoning):
    stream = MessageStream(reasoning_parser=unstreamed(name))
    assert not any(stream.feed(ch).get("reasoning_content") for ch in text)
    assert stream.finish().get("reasoning_content") == reasoning


# --------------------------------------------------------------------------- continued messages

@pytest.mark.parametrize("parser,prefill,text,expected", [
    ("qwen3", "<think>some reasoning", " more</think>Train.", (" more", "Train.")),
    ("deepseek-r1", "<think>done</think>Take", " the train.", ("", " the train.")),
    ("iquest_q1", "<think>work</think>The answer is ", "42.", ("", "42.")),
    ("apertus2509", "<|inner_prefix|>earlier", "more<|inner_suffix|>answer", ("more", "answer")),
    ("apertus2509", "<|inner_prefix|>r<|inner_suffix|>done", "more text", ("", "more text")),
    ("nemotron_3", '<think>analysis</think>{"text":"', '<think>literal</think>"}',
     ("", '<think>literal</think>"}')),
])
def test_a_continued_message_starts_where_its_prefill_left_off(parser, prefill, text, expected):
    assert rc(text, parser, prefill=prefill) == expected


@pytest.mark.parametrize("kwargs", [None, {"thinking": True}])
def test_a_continued_deepseek_v4_message_is_answer_text(kwargs):
    """DeepSeek-V4 renders the continued message after ``</think>``."""
    assert rc(" 5}", "deepseek-v4", prefill='{"answer":', chat_template_kwargs=kwargs) == (
        "", " 5}")


def test_a_new_think_block_after_a_finished_one_is_literal_in_a_continuation():
    """Deliberate difference: a continuation reads as the whole message would, so a second
    block after a closed one is answer text (SGLang starts a fresh block here)."""
    assert rc("<think>new</think>new answer", "qwen3",
              prefill="<think>old</think>old answer") == ("", "<think>new</think>new answer")


# --------------------------------------------------------------------------- separate_reasoning

def test_separate_reasoning_off_keeps_the_reasoning_text_in_content():
    """Deliberate difference: the reasoning text (markers removed) leads the content; SGLang
    skips the reasoning parser and returns the raw text."""
    assert rc("<think>weigh</think>Train.", "qwen3", separate_reasoning=False) == (
        "", "weighTrain.")


# --------------------------------------------------------------------------- Harmony

def test_harmony_analysis_is_reasoning_and_final_is_content():
    text = ("<|start|><|channel|>analysis<|message|>thinking hard<|end|>"
            "<|channel|>final<|message|>the answer<|end|>")
    assert rc(text, "gpt-oss") == ("thinking hard", "the answer")
    assert rc("<|start|><|channel|>final<|message|>just the answer<|end|>", "gpt-oss") == (
        "", "just the answer")


def test_harmony_text_between_messages_is_content():
    text = ("Some text <|channel|>analysis<|message|>reasoning<|end|> more text "
            "<|start|>assistant<|channel|>final<|message|>answer<|return|> trailing text")
    assert rc(text, "gpt-oss") == ("reasoning", "Some text  more text answer trailing text")


@pytest.mark.parametrize("text,expected", [
    ("<|channel|>analysis<|message|>  spaced out  <|end|>", ("  spaced out  ", "")),
    ("<|channel|>analysis<|message|><|end|>", ("", "")),
    ("<|channel|>analysis<|message|>first<|end|><|channel|>analysis<|message|>second<|end|>",
     ("firstsecond", "")),
    ("<|channel|>unknown<|message|>dropped<|end|>", ("", "")),
    ("<|end|><|start|><|channel|>final<|message|>answer<|end|>", ("", "answer")),
    ("text <|weird|> more<|channel|>analysis<|message|>r<|end|>", ("r", "text <|weird|> more")),
])
def test_harmony_messages(text, expected):
    assert rc(text, "gpt-oss") == expected


def test_harmony_a_tool_response_message_is_content():
    text = '<|start|>functions.lookup to=assistant<|message|>{"open": true}<|end|>'
    assert rc(text, "gpt-oss") == ("", '{"open": true}')


def test_harmony_a_builtin_tool_on_the_analysis_channel_is_passed_on():
    text = '<|channel|>analysis to=browser.search<|message|>{"query": "trains"}<|call|>'
    assert rc(text, "gpt-oss") == ("", "<|start|>assistant" + text)


HARMONY_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"place": {"type": "string"}}}}} for n in ("forecast", "temp")]


def test_harmony_commentary_filler_between_calls_is_dropped():
    text = ('<|channel|>analysis<|message|>Need data<|end|>'
            '<|start|>assistant<|channel|>commentary to=functions.forecast<|message|>'
            '{"place":"Lima"}<|call|>commentary'
            '<|channel|>commentary to=functions.temp<|message|>{"place":"Quito"}<|call|>'
            'commentary<|start|>assistant<|channel|>final<|message|>Done<|return|>')
    reasoning, content, calls = both(text, reasoning_parser="gpt-oss", tool_parser="gpt-oss",
                                     tools=HARMONY_TOOLS)
    assert (reasoning, content) == ("Need data", "Done")
    assert calls == [("forecast", {"place": "Lima"}), ("temp", {"place": "Quito"})]


def test_harmony_other_words_after_a_call_stay_content():
    text = '<|channel|>commentary to=functions.forecast<|message|>{}<|call|>comment here'
    assert both(text, reasoning_parser="gpt-oss", tool_parser="gpt-oss", tools=HARMONY_TOOLS) == (
        "", "comment here", [("forecast", {})])


# --------------------------------------------------------------------------- Muse Glimmer

SELF, USER = "<|start|>to=self<|message|>", "<|start|>to=user<|message|>"


@pytest.mark.parametrize("text,expected", [
    (f"{SELF}thinking about it<|eom|>{USER}the answer<|eom|>", ("thinking about it", "the answer")),
    ("just talking", ("", "just talking")),
    (f"{SELF}first<|eom|>{SELF}second<|eom|>", ("first\nsecond", "")),
    ("<|start|><|message|>hi<|eom|>", ("", "hi")),
    ("<|start|>to=functions<|message|>PAYLOAD<|eom|>",
     ("", "<|start|>to=functions<|message|>PAYLOAD<|eom|>")),
    (f"{SELF}final thought<|eot|>", ("final thought", "")),
    (f"  {USER}hi<|eom|>", ("", "  hi")),
    ("to=self<|message|>late header<|eom|>", ("late header", "")),
    ("<|start|>to", ("", "<|start|>to")),
    ("to=x is the syntax.", ("", "to=x is the syntax.")),
    ("to=a<b is false", ("", "to=a<b is false")),
])
def test_muse_channels(text, expected):
    assert rc(text, "muse") == expected


def test_muse_a_lone_reasoning_becomes_content_when_asked():
    assert rc(f"{SELF}only thinking<|eom|>", "muse", chat_template_kwargs=NONEMPTY,
              swapped=True) == ("", "only thinking")
    assert rc(f"{SELF}thought<|eom|>{USER}answer<|eom|>", "muse",
              chat_template_kwargs=NONEMPTY) == ("thought", "answer")


def test_muse_keep_user_framing_option_keeps_the_answer_channel():
    framed = parser_factory("reasoning_parser", "muse", options={"muse_keep_user_framing": True})
    text = f"{USER}ok<|eom|><|start|>to=functions<|message|>x<|eom|>"
    assert rc(text, framed) == ("", text)
    assert rc(text, "muse") == ("", "ok<|start|>to=functions<|message|>x<|eom|>")


DOUBLED = "get_weather.get_weather"
MUSE_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def atem(name: str, **params: str) -> str:
    body = "".join(f'<atem:parameter name="{k}">{v}</atem:parameter>\n' for k, v in params.items())
    return (f'<atem:function_calls>\n<atem:invoke name="{name}">\n{body}</atem:invoke>\n'
            "</atem:function_calls>")


def channel(recipient: str, body: str) -> str:
    return f"<|start|>assistant to={recipient}<|message|>{body}"


def muse(text: str) -> tuple[str, str, list]:
    return both(text, reasoning_parser="muse", tool_parser="muse", tools=MUSE_TOOLS)


def test_muse_a_tool_channel_the_output_ends_calls_without_leaving_framing():
    text = " to=self<|message|>Need weather.<|eom|>" + channel(DOUBLED, atem(DOUBLED, city="Lima"))
    assert muse(text) == ("Need weather.", "", [("get_weather", {"city": "Lima"})])


def test_muse_parallel_channels_and_an_answer_after_them():
    text = (" to=self<|message|>Two cities.<|eom|>"
            + channel(DOUBLED, atem(DOUBLED, city="Lima")) + "<|eom|>"
            + channel(DOUBLED, atem(DOUBLED, city="Quito")) + "<|eom|>"
            + channel("user", "Both are sunny."))
    assert muse(text) == ("Two cities.", "Both are sunny.",
                          [("get_weather", {"city": "Lima"}), ("get_weather", {"city": "Quito"})])


@pytest.mark.parametrize("text", [
    f" to=self<|message|>Maybe I call {atem(DOUBLED, city='X')} - no.<|eom|>"
    + channel("user", "I will not call it."),
    " to=self<|message|>r<|eom|>" + channel("user", "You would write:\n" + atem(DOUBLED, city="X")),
    f" to=self<|message|>I could call {atem(DOUBLED, city='X')} but",
    atem(DOUBLED, city="Lima"),
])
def test_muse_a_block_outside_a_tool_channel_is_never_a_call(text):
    assert muse(text)[2] == []


def test_muse_a_tool_channel_cut_mid_block_is_not_a_call():
    """Deliberate difference: the cut channel stays content (SGLang drops it)."""
    cut = channel(DOUBLED, f'<atem:function_calls>\n<atem:invoke name="{DOUBLED}">\n'
                           '<atem:parameter name="city">Li')
    assert muse(" to=self<|message|>Need weather.<|eom|>" + cut) == ("Need weather.", cut, [])


def test_muse_interleaved_reasoning_is_joined_with_a_newline():
    text = (" to=self<|message|>first thought<|eom|>"
            + channel(DOUBLED, atem(DOUBLED, city="Lima")) + "<|eom|>"
            + channel("self", "second thought<|eom|>") + channel("user", "done"))
    assert muse(text) == ("first thought\nsecond thought", "done",
                          [("get_weather", {"city": "Lima"})])


def test_muse_pipeline_edges():
    assert muse("Just plain text.") == ("", "Just plain text.", [])
    assert muse(" to=self<|message|>r<|eom|>" + channel("user", "answer<|st")) == (
        "r", "answer<|st", [])
    assert muse(" to=self<|message|>r<|eom|>\n" + channel(DOUBLED, atem(DOUBLED, city="Lima")))[
        2] == [("get_weather", {"city": "Lima"})]
    assert muse(" to=self<|message|>r<|eom|>" + channel("user", "Let me check.<|eom|>")
                + channel(DOUBLED, atem(DOUBLED, city="Lima"))) == (
        "r", "Let me check.", [("get_weather", {"city": "Lima"})])


# --------------------------------------------------------------------------- Apertus and Cohere

IN, OUT = "<|inner_prefix|>", "<|inner_suffix|>"
TOOLS_IN, TOOLS_OUT = "<|tools_prefix|>", "<|tools_suffix|>"


@pytest.mark.parametrize("text,expected", [
    ("hello world", ("", "hello world")),
    (f"{IN}thoughts{OUT}answer", ("thoughts", "answer")),
    (f"hello {IN}think{OUT}world", ("think", "hello world")),
    (f"{IN}a{OUT}x{IN}b{OUT}y", ("ab", "xy")),
    (f'{IN}plan{TOOLS_IN}[{{"name": "x"}}]{TOOLS_OUT}done{OUT}final',
     ("plandone", f'{TOOLS_IN}[{{"name": "x"}}]{TOOLS_OUT}final')),
    (f"{IN}still thinking", ("still thinking", "")),
    (f'{IN}plan{TOOLS_IN}[{{"name": "x"}}', ("plan", f'{TOOLS_IN}[{{"name": "x"}}')),
    (f"{IN}pre{TOOLS_IN}[data<|tools_suf", ("pre", f"{TOOLS_IN}[data<|tools_suf")),
    (f"{IN}before {TOOLS_IN} after{OUT}final", (f"before {TOOLS_IN} after", "final")),
    ("x<|innerXy", ("", "x<|innerXy")),
    (f"{IN}text<|inner_suf", ("text<|inner_suf", "")),
])
def test_apertus_blocks(text, expected):
    assert rc(text, "apertus2509") == expected


@pytest.mark.parametrize("text,expected", [
    ("thinking<|END_THINKING|><|START_TEXT|>answer<|END_TEXT|>", ("thinking", "answer")),
    ("<|START_THINKING|>thinking<|END_THINKING|><|START_TEXT|>answer<|END_TEXT|>",
     ("thinking", "answer")),
    ("<|START_TEXT|>answer<|END_TEXT|>", ("", "answer")),
    ('thinking<|END_THINKING|><|START_ACTION|>{"tool": "search"}<|END_ACTION|>',
     ("thinking", '<|START_ACTION|>{"tool": "search"}<|END_ACTION|>')),
    ('<|START_ACTION|>{"tool": "search"}<|END_ACTION|>',
     ("", '<|START_ACTION|>{"tool": "search"}<|END_ACTION|>')),
    ("thinking without any marker", ("thinking without any marker", "")),
    ("th<|END_THINKING|><|START_TEXT|>cut off", ("th", "cut off")),
    ("th<|END_THINKING|><|START_ACTION|>payload", ("th", "<|START_ACTION|>payload")),
    ("<|START_THINKING|>checking<|END_THINKING|>", ("checking", "")),
])
def test_cohere_blocks(text, expected):
    assert rc(text, "cohere_command4") == expected


# --------------------------------------------------------------------------- MiniCPM5 and Ling

MINICPM_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "date": {"type": "string"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "sum_values", "parameters": {
        "type": "object", "properties": {"nums": {"type": "array"}, "exact": {"type": "boolean"}},
        "required": ["nums"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {
        "type": "object", "properties": {"note": {"type": "string"}}, "required": []}}},
]


def minicpm(text: str) -> tuple[str, list]:
    _, content, calls = both(text, tool_parser="minicpm5", tools=MINICPM_TOOLS)
    return content, calls


def fn(name: str, *params: tuple[str | None, str]) -> str:
    inner = "".join(f'<param name="{k}">{v}</param>' if k else f"<param>{v}</param>"
                    for k, v in params)
    return f'<function name="{name}">{inner}</function>'


def test_minicpm5_calls_keep_the_text_around_them():
    text = ("Head\n" + fn("get_weather", ("city", "Lima")) + "\nMiddle\n"
            + fn("sum_values", ("nums", "[7,8,9]"), ("exact", "false")) + "\nTail\n")
    assert minicpm(text) == ("Head\nMiddle\nTail\n", [
        ("get_weather", {"city": "Lima"}), ("sum_values", {"nums": [7, 8, 9], "exact": False})])


@pytest.mark.parametrize("text,calls", [
    (fn("get_weather", ("city", "<![CDATA[Li\nma]]>"), ("date", "2024-06-27")),
     [("get_weather", {"city": "Li\nma", "date": "2024-06-27"})]),
    (fn("sum_values", ("nums", "[1, 2, 3]"), ("exact", "true")),
     [("sum_values", {"nums": [1, 2, 3], "exact": True})]),
    (fn("get_weather", ("city", "A & B")), [("get_weather", {"city": "A & B"})]),
    (fn("noop"), [("noop", {})]),
    (fn("get_weather", ("city", "Lima")) + fn("sum_values", ("nums", "[1,2]")),
     [("get_weather", {"city": "Lima"}), ("sum_values", {"nums": [1, 2]})]),
])
def test_minicpm5_values(text, calls):
    assert minicpm(text) == ("", calls)


@pytest.mark.parametrize("text", [
    fn("unknown", ("x", "1")),
    fn("get_weather", (None, "Lima"), ("date", "2024-06-27")),
    fn("get_weather", ("city", "Lima"), ("city", "Quito")),
    fn("get_weather", ("City", "Lima")),
    '<function name="get_weather"><param name="city">Lima</param>',
    "hello <fun",
])
def test_minicpm5_an_element_that_cannot_be_a_call_stays_content(text):
    assert minicpm(text) == (text, [])


LING_TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "date", "parameters": {
        "type": "object", "properties": {}}}},
]


@pytest.mark.parametrize("text,calls", [
    ("<tool_call>weather\n<arg_key>city</arg_key><arg_value>Lima</arg_value></tool_call>",
     [("weather", {"city": "Lima"})]),
    ("<tool_call>weather<arg_key>city</arg_key><arg_value>Quito</arg_value></tool_call>",
     [("weather", {"city": "Quito"})]),
    ("<tool_call>date</tool_call>", [("date", {})]),
])
def test_ling3_calls_with_or_without_a_newline_after_the_name(text, calls):
    assert both(text, tool_parser="ling3", tools=LING_TOOLS) == ("", "", calls)


def test_ling3_a_call_after_reasoning_in_one_pipeline():
    text = "<think>need the date<tool_call>date</tool_call>"
    assert both(text, reasoning_parser="ling3", tool_parser="ling3", tools=LING_TOOLS) == (
        "need the date", "", [("date", {})])
