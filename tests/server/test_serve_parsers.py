"""Reasoning and tool-call parsing wired into ``/v1/chat/completions``.

End to end against the ``parsers`` server (``--reasoning-parser qwen3 --tool-call-parser
hermes``) with the real default model. SmolLM2 never writes ``<think>`` or a tool call of its
own, so the checks rest on what the fact sheet fixes for such output: ``qwen3`` starts inside
reasoning unless ``chat_template_kwargs.enable_thinking`` is false (the whole greedy answer is
then reasoning), and a plain answer given ``tools`` is content with no calls. The shape of
streamed tool-call deltas is checked on the server's own chat-message code
(:func:`chat_message`, :class:`ChatDeltas`) driven with a text holding a hermes call.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from engine.parsers.api import assemble
from engine.runtime.frontend import RequestError
from engine.assembly import ParserFactories, parser_factory
from engine.server.openai_api import ChatDeltas, chat_message, parser_kwargs
from engine.server.protocol import ChatCompletionRequest

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Name a colour."}]
BASE = {"messages": MSG, "max_tokens": 10, "temperature": 0}
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object",
                                           "properties": {"tz": {"type": "string"}}}}},
]


def post(server: Any, body: dict[str, Any]) -> httpx.Response:
    with server.client() as c:
        return c.post(CHAT, json=body)


def message(server: Any, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    r = post(server, body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"], choice["finish_reason"]


def stream_events(server: Any, body: dict[str, Any]) -> list[Any]:
    """Every SSE data item of a streamed chat request (``"[DONE]"`` included)."""
    events = []
    with server.client() as c, c.stream("POST", CHAT, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                events.append(data if data == "[DONE]" else json.loads(data))
    assert events[-1] == "[DONE]"
    return events


def streamed(server: Any, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The streamed message (deltas assembled) and the last finish reason."""
    events = [e for e in stream_events(server, body)[:-1]]
    assert all("error" not in e for e in events), events
    choices = [e["choices"][0] for e in events if e["choices"]]
    reasons = [c["finish_reason"] for c in choices]
    assert set(reasons[:-1]) == {None} and reasons[-1] is not None
    return assemble(c["delta"] for c in choices), reasons[-1]


@pytest.fixture(scope="module")
def plain(main_server: Any) -> tuple[str, str]:
    """Greedy text and finish reason of the request on the server without parsers."""
    msg, reason = message(main_server, BASE)
    assert msg["content"]
    return msg["content"], reason


# ---------------------------------------------------------------------- reasoning


@pytest.mark.slow
def test_reasoning_on_by_default_and_switched_off_per_request(parser_server, plain) -> None:
    text, reason = plain
    msg, r = message(parser_server, BASE)
    assert (msg["reasoning_content"], msg["content"], r) == (text, None, reason)
    assert "tool_calls" not in msg
    # qwen3 keys on enable_thinking only (fact sheet §0.2): `thinking: false` leaves it on
    msg, _ = message(parser_server, {**BASE, "chat_template_kwargs": {"thinking": False}})
    assert (msg["reasoning_content"], msg["content"]) == (text, None)
    msg, r = message(parser_server, {**BASE, **OFF})
    assert (msg["reasoning_content"], msg["content"], r) == (None, text, reason)
    msg, _ = message(parser_server, {**BASE, "separate_reasoning": False})
    assert (msg["reasoning_content"], msg["content"]) == (None, text)


@pytest.mark.slow
def test_streamed_reasoning_adds_up_to_the_message(parser_server, plain) -> None:
    text, reason = plain
    events = stream_events(parser_server, BASE)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert sum(1 for d in deltas if d.get("reasoning_content")) > 1  # streamed, not at the end
    assert all(not d.get("content") for d in deltas)
    assert streamed(parser_server, BASE) == (
        {"reasoning_content": text, "content": None, "tool_calls": []}, reason)
    assert streamed(parser_server, {**BASE, **OFF}) == (
        {"reasoning_content": None, "content": text, "tool_calls": []}, reason)


# ---------------------------------------------------------------------- tools


@pytest.mark.slow
def test_plain_answer_with_tools_is_content(parser_server, plain) -> None:
    text, reason = plain
    body = {**BASE, **OFF, "tools": TOOLS}
    for choice in ("auto", "none", None):
        extra = {} if choice is None else {"tool_choice": choice}
        msg, r = message(parser_server, {**body, **extra})
        assert msg["content"] == text and "tool_calls" not in msg, choice
        assert r == reason and r in ("stop", "length")
    assert streamed(parser_server, {**body, "tool_choice": "auto"}) == (
        {"reasoning_content": None, "content": text, "tool_calls": []}, reason)


@pytest.mark.slow
def test_required_or_named_tool_choice_without_a_call_is_a_clear_error(parser_server) -> None:
    body = {**BASE, **OFF, "max_tokens": 4, "tools": TOOLS}
    r = post(parser_server, {**body, "tool_choice": "required"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tool_choice" and "no valid tool call" in err["message"]
    named = {"type": "function", "function": {"name": "get_time"}}
    r = post(parser_server, {**body, "tool_choice": named})
    assert r.status_code == 400 and "get_time" in r.json()["error"]["message"]
    unknown = {"type": "function", "function": {"name": "nope"}}
    r = post(parser_server, {**body, "tool_choice": unknown})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "not among the tools" in r.json()["error"]["message"]
    events = stream_events(parser_server, {**body, "tool_choice": "required"})
    errors = [e["error"] for e in events[:-1] if "error" in e]
    assert len(errors) == 1 and errors[0]["param"] == "tool_choice"
    assert errors[0]["code"] == "tool_call_missing"


@pytest.mark.slow
def test_tool_call_history_is_rendered(parser_server) -> None:
    """An assistant turn with only ``tool_calls`` (arguments as a JSON text, content null)
    and the ``tool`` result after it are accepted and rendered: the ``tool`` turn adds exactly
    its own tokens to the prompt (SmolLM2's template renders it as a turn of role ``tool`` and
    has no place for ``tool_calls`` or ``tools``)."""
    call = {"id": "call_0123456789abcdef01234567", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call]}]
    result = {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 24 C"}
    body = {**OFF, "tools": TOOLS, "max_tokens": 2, "temperature": 0}
    usage = {}
    for name, messages in (("calls", history), ("result", [*history, result])):
        r = post(parser_server, {**body, "messages": messages})
        assert r.status_code == 200, r.text
        usage[name] = r.json()["usage"]["prompt_tokens"]
    with parser_server.client() as c:
        turn = c.post("/generate", json={"text": "<|im_start|>tool\nSunny, 24 C<|im_end|>\n",
                                         "sampling_params": {"max_new_tokens": 1}})
    assert turn.status_code == 200, turn.text
    assert usage["result"] - usage["calls"] == turn.json()["meta_info"]["prompt_tokens"]


# ---------------------------------------------------------------------- the server's message code


CALL_TEXT = ('Let me look.</think>Checking.\n<tool_call>\n{"name": "get_weather", '
             '"arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
             '"arguments": {"tz": "CET"}}\n</tool_call>')


PARSERS = ParserFactories(reasoning=parser_factory("reasoning_parser", "qwen3"),
                          tool=parser_factory("tool_parser", "hermes"))


def _pkw(**body: Any) -> dict[str, Any] | None:
    request = ChatCompletionRequest(messages=MSG, tools=TOOLS, **body)
    return parser_kwargs(request, PARSERS)


def _stream(text: str, pkw: dict[str, Any] | None, forced: str | None,
            size: int) -> tuple[list[dict[str, Any]], str | None, dict[str, Any] | None]:
    choice = ChatDeltas(pkw, forced)
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    deltas = []
    for n, piece in enumerate(pieces):
        deltas += choice.feed(piece, finished=n == len(pieces) - 1)
    return (deltas, *choice.close("stop"))


def _without_ids(msg: dict[str, Any]) -> dict[str, Any]:
    calls = [{k: v for k, v in c.items() if k != "id"} for c in msg.get("tool_calls") or ()]
    return {"reasoning_content": msg.get("reasoning_content"), "content": msg.get("content"),
            "tool_calls": calls}


@pytest.mark.parametrize("size", [1, 4, 17, len(CALL_TEXT)])
def test_streamed_tool_call_deltas_add_up_to_the_message(size: int) -> None:
    pkw = _pkw()
    whole, reason = chat_message(CALL_TEXT, "stop", pkw, None)
    assert reason == "tool_calls"
    assert whole["reasoning_content"] == "Let me look." and whole["content"] == "Checking."
    calls = whole["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"},
                                                                       {"tz": "CET"}]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    deltas, reason, error = _stream(CALL_TEXT, pkw, None, size)
    assert (reason, error) == ("tool_calls", None)
    call_deltas = [tc for d in deltas for tc in d.get("tool_calls", ())]
    for index in (0, 1):
        mine = [tc for tc in call_deltas if tc["index"] == index]
        first, later = mine[0], mine[1:]
        assert first["id"].startswith("call_") and first["type"] == "function"
        assert first["function"]["name"] == calls[index]["function"]["name"]
        assert all(set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                   for tc in later)
    assert _without_ids(assemble(deltas)) == _without_ids(whole)


def test_unknown_tool_is_text_and_forced_choice_is_enforced() -> None:
    unknown = 'Ok.</think><tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
    whole, reason = chat_message(unknown, "stop", _pkw(), None)
    assert reason == "stop" and "tool_calls" not in whole
    assert whole["content"] == unknown.split("</think>")[1]
    deltas, reason, _ = _stream(unknown, _pkw(), None, 5)
    assert reason == "stop" and _without_ids(assemble(deltas)) == _without_ids(whole)
    # a named tool_choice keeps only calls to that tool, streamed or not
    named = _pkw(tool_choice={"type": "function", "function": {"name": "get_time"}})
    whole, _ = chat_message(CALL_TEXT, "stop", named, "get_time")
    assert [c["function"]["name"] for c in whole["tool_calls"]] == ["get_time"]
    deltas, reason, error = _stream(CALL_TEXT, named, "get_time", 3)
    assert (reason, error) == ("tool_calls", None)
    assert _without_ids(assemble(deltas)) == _without_ids(whole)
    # required with no call: a 400 (whole) or an error event (streamed)
    with pytest.raises(RequestError) as exc:
        chat_message(unknown, "stop", _pkw(tool_choice="required"), "")
    assert exc.value.param == "tool_choice"
    _, reason, error = _stream(unknown, _pkw(tool_choice="required"), "", 5)
    assert reason == "stop" and error["error"]["param"] == "tool_choice"
    # tool_choice none: no tool parsing at all, the call text is content as generated
    assert _pkw(tool_choice="none")["tool_parser"] is None
    whole, reason = chat_message(CALL_TEXT, "stop", _pkw(tool_choice="none"), None)
    assert reason == "stop" and "tool_calls" not in whole


def test_continue_final_message_parses_from_the_state_the_prefill_left() -> None:
    """The prefilled assistant message is read by the parsers first: after a closed think
    block the continuation is content (not reasoning), streamed or whole, and the prefill's
    own text is not returned again; an open think block keeps the continuation reasoning."""
    closed = [*MSG, {"role": "assistant", "content": "<think>weighed it</think>The total is "}]
    pkw = parser_kwargs(ChatCompletionRequest(messages=closed, continue_final_message=True),
                        PARSERS)
    assert pkw["prefill"] == "<think>weighed it</think>The total is "
    whole, _ = chat_message("17.", "stop", pkw, None)
    assert (whole["reasoning_content"], whole["content"]) == (None, "17.")
    for size in (1, 2):
        deltas, _, _ = _stream("17.", pkw, None, size)
        assert _without_ids(assemble(deltas)) == _without_ids(whole)
    still_open = [*MSG, {"role": "assistant", "content": [{"type": "text",
                                                           "text": "<think>first, "}]}]
    pkw = parser_kwargs(ChatCompletionRequest(messages=still_open, continue_final_message=True),
                        PARSERS)
    whole, _ = chat_message("then</think>Done.", "stop", pkw, None)
    assert (whole["reasoning_content"], whole["content"]) == ("then", "Done.")
    # without the flag the final assistant message is history, not a prefill
    plain = parser_kwargs(ChatCompletionRequest(messages=closed), PARSERS)
    assert plain["prefill"] is None
    assert chat_message("17.", "stop", plain, None)[0]["reasoning_content"] == "17."


def test_continue_final_message_completes_a_call_the_prefill_began() -> None:
    began = [*MSG, {"role": "assistant", "content":
                    '<think>ok</think><tool_call>\n{"name": "get_weather", "arguments": '}]
    pkw = parser_kwargs(ChatCompletionRequest(messages=began, tools=TOOLS,
                                              continue_final_message=True), PARSERS)
    whole, reason = chat_message('{"city": "Oslo"}}\n</tool_call>', "stop", pkw, None)
    assert reason == "tool_calls" and whole["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in whole["tool_calls"]] == [("get_weather", {"city": "Oslo"})]
    deltas, reason, _ = _stream('{"city": "Oslo"}}\n</tool_call>', pkw, None, 3)
    assert reason == "tool_calls" and _without_ids(assemble(deltas)) == _without_ids(whole)
