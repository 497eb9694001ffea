"""Structured output through a real server (``main``: the default grammar backend, llguidance;
``aux``: ``--grammar-backend none``; a module server with ``--tool-call-parser hermes``): every
constrained output parses and validates, streamed or not, on chat, completions and /generate,
while unconstrained greedy requests running beside them give their solo outputs; invalid
constraints are a 400 with the backend's message; a forced ``tool_choice`` decodes a valid
call."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from conftest import running, start_server
from forced_call_tools import TOOLS

CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
MAX_TOKENS = 120

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
            "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
            "required": ["id", "email"], "additionalProperties": False},
        "active": {"type": "boolean"}},
        "required": ["user", "active"], "additionalProperties": False},
    "enums-and-bounded-array": {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                   "minItems": 1, "maxItems": 3},
        "size": {"enum": ["S", "M", "L"]}},
        "required": ["colors", "size"], "additionalProperties": False},
    "any-of": {"type": "object", "properties": {
        "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10},
                            {"type": "string", "maxLength": 10}, {"type": "null"}]}},
        "required": ["value"], "additionalProperties": False},
    "number-range": {"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": -50, "maximum": 60},
        "unit": {"enum": ["C", "F"]}},
        "required": ["temperature", "unit"], "additionalProperties": False},
    "array-of-objects": {"type": "array", "items": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["x"], "additionalProperties": False}, "minItems": 2, "maxItems": 4},
}
REGEXES = [r"(yes|no), because [a-z ]{3,20}\.", r"[A-Z][a-z]{2,10}-[0-9]{3}",
           r"\d{4}-\d{2}-\d{2}"]
EBNF = ('root ::= animal " " verb " " place\nanimal ::= "cat" | "dog" | "bird"\n'
        'verb ::= "sleeps" | "runs"\nplace ::= "here" | "there" | "outside"\n')
EBNF_LANGUAGE = {f"{a} {v} {p}" for a in ("cat", "dog", "bird") for v in ("sleeps", "runs")
                 for p in ("here", "there", "outside")}
PLAIN = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


def chat_schema(name: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"Give an example {name} as JSON."}],
            "max_tokens": MAX_TOKENS, "temperature": 0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": name, "schema": schema, "strict": True}},
            **extra}


def stream_text(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[str, str]:
    """The streamed text and finish reason of one OpenAI request."""
    text, reason = "", None
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for choice in event["choices"]:
                text += choice.get("delta", {}).get("content") or choice.get("text") or ""
                reason = choice.get("finish_reason") or reason
    return text, reason


def plain(client: httpx.Client, prompt: str) -> str:
    r = client.post(COMPL, json={"prompt": prompt, "max_tokens": 16, "temperature": 0,
                                 "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def validate(text: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(text), schema)


def test_constrained_outputs_validate_in_a_concurrent_mix(main_server) -> None:
    """Every schema through chat (plain and streamed) and completions, the regexes and the
    grammar through /generate and completions, all at once with unconstrained greedy
    requests, whose outputs equal their solo outputs."""
    with main_server.client(timeout=600) as c:
        solo = {p: plain(c, p) for p in PLAIN}
    local = threading.local()

    def client() -> httpx.Client:
        """This thread's own connection (a shared one may sit idle past keep-alive)."""
        if not hasattr(local, "client"):
            local.client = main_server.client(timeout=600)
        return local.client

    def chat(name: str) -> None:
        r = client().post(CHAT, json=chat_schema(name, SCHEMAS[name]))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        validate(choice["message"]["content"], SCHEMAS[name])

    def chat_streamed(name: str) -> None:
        text, reason = stream_text(client(), CHAT, chat_schema(name, SCHEMAS[name]))
        assert reason == "stop"
        validate(text, SCHEMAS[name])

    def completion(name: str) -> None:
        r = client().post(COMPL, json={"prompt": f"An example {name} in JSON: ",
                                       "max_tokens": MAX_TOKENS, "temperature": 0,
                                       "json_schema": json.dumps(SCHEMAS[name])})
        assert r.status_code == 200, r.text
        validate(r.json()["choices"][0]["text"], SCHEMAS[name])

    def generate_regex(pattern: str) -> None:
        r = client().post("/generate", json={"text": "Answer: ", "sampling_params": {
            "max_new_tokens": 40, "temperature": 0, "regex": pattern}})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert re.fullmatch(pattern, out["text"]), out["text"]

    def completion_regex_streamed(pattern: str) -> None:
        text, reason = stream_text(client(), COMPL, {"prompt": "Answer: ", "max_tokens": 40,
                                                     "temperature": 0.7, "seed": 3,
                                                     "regex": pattern})
        assert reason == "stop" and re.fullmatch(pattern, text), text

    def grammar() -> None:
        r = client().post("/generate", json={"text": "A short sentence: ",
                                             "sampling_params": {"max_new_tokens": 20,
                                                                 "temperature": 0,
                                                                 "ebnf": EBNF}})
        assert r.status_code == 200 and r.json()["text"] in EBNF_LANGUAGE, r.text

    def unconstrained(prompt: str) -> None:
        assert plain(client(), prompt) == solo[prompt]

    jobs = [(chat, n) for n in SCHEMAS] + [(chat_streamed, n) for n in SCHEMAS] + \
        [(completion, n) for n in ("person", "any-of", "array-of-objects")] + \
        [(generate_regex, p) for p in REGEXES] + \
        [(completion_regex_streamed, p) for p in REGEXES] + [(grammar, None)] + \
        [(unconstrained, p) for p in PLAIN * 2]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(f, *(() if a is None else (a,))) for f, a in jobs]
        for f in futures:
            f.result()


def test_json_object_n_logprobs_and_a_batch_of_constraints(main_server) -> None:
    with main_server.client(timeout=300) as c:
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "A cat as JSON."}],
                               "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": 7, "n": 2,
                               "logprobs": True, "top_logprobs": 5,
                               "response_format": {"type": "json_object"}})
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"]:
            if choice["finish_reason"] == "stop":
                assert isinstance(json.loads(choice["message"]["content"]), dict)
            for entry in choice["logprobs"]["content"]:
                assert all(alt["logprob"] > -1e30 for alt in entry["top_logprobs"])
        # /generate: one sampling_params per prompt, each with its own constraint (or none)
        r = c.post("/generate", json={"text": ["Yes or no? ", "A number: ", "Hello"],
                                      "sampling_params": [
                                          {"max_new_tokens": 8, "temperature": 0,
                                           "regex": "(yes|no)"},
                                          {"max_new_tokens": 8, "temperature": 0,
                                           "json_schema": '{"type": "integer", "minimum": 10, '
                                                          '"maximum": 99}'},
                                          {"max_new_tokens": 4, "temperature": 0}]})
        assert r.status_code == 200, r.text
        outs = r.json()
        assert outs[0]["text"] in ("yes", "no")
        assert 10 <= json.loads(outs[1]["text"]) <= 99
        assert outs[2]["meta_info"]["finish_reason"]["type"] in ("stop", "length")


@pytest.mark.parametrize("path,body,param,words", [
    (CHAT, chat_schema("bad", {"type": "nonsense"}), "response_format", "nonsense"),
    (COMPL, {"prompt": "x", "json_schema": '{"type": "object", "properties": '}, "json_schema",
     "invalid json_schema"),
    (COMPL, {"prompt": "x", "regex": "a(b"}, "regex", "unclosed group"),
    ("/generate", {"text": "x", "sampling_params": {"ebnf": 'root ::= "a" ('}}, "ebnf",
     "invalid ebnf"),
], ids=["schema", "schema-text", "regex", "ebnf"])
def test_an_invalid_constraint_is_a_400_with_the_backends_message(main_server, path, body,
                                                                   param, words) -> None:
    with main_server.client() as c:
        r = c.post(path, json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == "invalid_grammar", err
        assert words in err["message"], err["message"]
        assert c.post(COMPL, json={"prompt": "Hi", "max_tokens": 2}).status_code == 200


def test_grammar_backend_none_refuses_constraints_and_serves_the_rest(aux_server) -> None:
    with aux_server.client() as c:
        for body in ({"prompt": "x", "max_tokens": 2, "regex": "a+"},
                     {"prompt": "x", "max_tokens": 2, "response_format": {"type": "json_object"}},
                     {"prompt": "x", "max_tokens": 2, "response_format": STRUCTURAL_TAG}):
            r = c.post(COMPL, json=body)
            assert r.status_code == 400, r.text
            assert "--grammar-backend none" in r.json()["error"]["message"]
        ok = c.post(COMPL, json={"prompt": "x", "max_tokens": 2,
                                 "response_format": {"type": "text"}})
        assert ok.status_code == 200, ok.text


STRUCTURAL_TAG = {"type": "structural_tag", "triggers": ["<function="], "structures": [
    {"begin": "<function=get_weather>", "end": "</function>",
     "schema": TOOLS[0]["function"]["parameters"]},
    {"begin": "<function=get_time>", "end": "</function>",
     "schema": TOOLS[1]["function"]["parameters"]}]}
FEW_SHOT = ('Q: time in Berlin?\nA: <function=get_time>{"tz": "CET"}</function>\n'
            'Q: weather in Rome?\nA: <function=get_weather>{"city": "Rome", "unit": "C"}'
            '</function>\nQ: weather in Paris?\nA:')


def tagged_calls(text: str) -> list[tuple[str, Any]]:
    """Each ``<function=NAME>JSON</function>`` of ``text``; fails on a trigger that does not
    start a valid structure."""
    out, pos = [], 0
    while (i := text.find("<function=", pos)) >= 0:
        m = re.compile(r"<function=(get_weather|get_time)>").match(text, i)
        assert m, text[i:]
        value, end = json.JSONDecoder().raw_decode(text, m.end())
        jsonschema.validate(value, TOOL_SCHEMAS[m.group(1)])
        assert text.startswith("</function>", end), text[end:]
        out.append((m.group(1), value))
        pos = end + len("</function>")
    return out


def test_a_structural_tag_constrains_what_follows_each_trigger(main_server) -> None:
    tag_text = json.dumps({k: v for k, v in STRUCTURAL_TAG.items() if k != "type"})
    with main_server.client(timeout=600) as c:
        r = c.post(COMPL, json={"prompt": FEW_SHOT, "max_tokens": 60, "temperature": 0,
                                "stop": ["\n"], "response_format": STRUCTURAL_TAG})
        assert r.status_code == 200, r.text
        assert tagged_calls(r.json()["choices"][0]["text"]) == [
            ("get_weather", {"city": "Paris", "unit": "C"})], r.json()
        r = c.post("/generate", json={"text": FEW_SHOT, "sampling_params": {
            "max_new_tokens": 60, "temperature": 0.8, "seed": 1, "stop": ["\n"],
            "structural_tag": tag_text}})
        assert r.status_code == 200, r.text
        tagged_calls(r.json()["text"])
        chat = c.post(CHAT, json={"messages": [{"role": "user", "content": "Say hello."}],
                                  "max_tokens": 30, "temperature": 0,
                                  "response_format": STRUCTURAL_TAG})
        assert chat.status_code == 200, chat.text
        tagged_calls(chat.json()["choices"][0]["message"]["content"])
        bad = {**STRUCTURAL_TAG, "triggers": ["<tool>"]}
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "x"}],
                               "response_format": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        assert "does not start with any of the triggers" in r.json()["error"]["message"]


#: the tool-call parsers whose forced calls are constrained while decoding
FORCED_PARSERS = ["hermes", "qwen25", "llama3", "mistral", "pythonic"]
FORCED_PROMPTS = ["What's the weather in Paris?", "What time is it in Tokyo?",
                  "Is it raining in Oslo right now?", "Tell me a joke about cats.",
                  "Weather for Lima, in Fahrenheit please."]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module", params=FORCED_PARSERS)
def tool_server(request, servers):
    """One server per tool-call parser, one at a time."""
    with running(start_server(request.param, "--max-running-requests", "8",
                              "--tool-call-parser", request.param)) as started:
        yield started[request.param]


def forced_body(prompt: str, choice: Any, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "tools": TOOLS,
            "tool_choice": choice, "max_tokens": MAX_TOKENS, "temperature": 0,
            "parallel_tool_calls": False, **extra}


def check_calls(message: dict[str, Any], choice: Any) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    assert calls, message
    for call in calls:
        name = call["function"]["name"]
        assert name == (choice["function"]["name"] if isinstance(choice, dict) else name)
        jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL_SCHEMAS[name])
    return calls


def test_every_forced_tool_choice_decodes_a_valid_call_in_the_parsers_format(
        tool_server) -> None:
    """Each prompt, with ``required`` and with a named tool (greedy and sampled, one call or
    parallel calls allowed): 100 % of the responses carry valid calls. (With parallel calls
    allowed, the default model may go on calling until ``max_tokens``: its complete calls are
    valid.)"""
    named = {"type": "function", "function": {"name": "get_time"}}
    bodies = []
    for i, prompt in enumerate(FORCED_PROMPTS):
        bodies.append(forced_body(prompt, "required", parallel_tool_calls=i == 0))
        bodies.append(forced_body(prompt, named, temperature=0.7, seed=i))
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda b: tool_server.client(timeout=600).post(CHAT, json=b),
                                  bodies))
    for body, r in zip(bodies, responses):
        assert r.status_code == 200, (tool_server.name, body["messages"], r.text)
        out = r.json()["choices"][0]
        calls = check_calls(out["message"], body["tool_choice"])
        if body["parallel_tool_calls"]:  # the model may repeat calls up to max_tokens
            assert out["finish_reason"] in ("tool_calls", "length"), (tool_server.name, out)
        else:
            assert out["finish_reason"] == "tool_calls", (tool_server.name, out)
            assert len(calls) == 1, out
    # streamed: the same call as the whole response, in deltas
    body = bodies[1]
    whole = responses[1].json()["choices"][0]["message"]["tool_calls"][0]["function"]
    streamed: dict[str, str] = {"name": "", "arguments": ""}
    with tool_server.client(timeout=300) as c, \
            c.stream("POST", CHAT, json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for delta_call in event["choices"][0]["delta"].get("tool_calls") or ():
                fn = delta_call.get("function", {})
                streamed["name"] += fn.get("name") or ""
                streamed["arguments"] += fn.get("arguments") or ""
    assert streamed == whole


def test_a_forced_call_with_a_reasoning_parser_follows_the_reasoning(parser_server) -> None:
    """``--reasoning-parser qwen3 --tool-call-parser hermes``: reasoning off for the request
    (``enable_thinking: false``), so a ``<think>`` section is optional; the call is forced
    after it."""
    kw = {"chat_template_kwargs": {"enable_thinking": False}}
    with parser_server.client(timeout=600) as c:
        for prompt in FORCED_PROMPTS[:3]:
            r = c.post(CHAT, json=forced_body(prompt, "required", **kw))
            assert r.status_code == 200, r.text
            out = r.json()["choices"][0]
            assert out["finish_reason"] == "tool_calls", out
            check_calls(out["message"], "required")
