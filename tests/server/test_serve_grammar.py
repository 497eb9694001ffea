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
                     {"prompt": "x", "max_tokens": 2, "response_format": {"type": "json_object"}}):
            r = c.post(COMPL, json=body)
            assert r.status_code == 400, r.text
            assert "--grammar-backend none" in r.json()["error"]["message"]
        ok = c.post(COMPL, json={"prompt": "x", "max_tokens": 2,
                                 "response_format": {"type": "text"}})
        assert ok.status_code == 200, ok.text


@pytest.fixture(scope="module")
def hermes_server(servers):
    with running(start_server("hermes", "--max-running-requests", "4",
                              "--tool-call-parser", "hermes")) as started:
        yield started["hermes"]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_a_forced_tool_choice_is_decoded_as_a_valid_call(hermes_server, choice) -> None:
    body = {"messages": [{"role": "user", "content": "What's the weather in Paris?"}],
            "tools": TOOLS, "tool_choice": choice, "max_tokens": MAX_TOKENS,
            "temperature": 0, "parallel_tool_calls": False}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    with hermes_server.client(timeout=300) as c:
        r = c.post(CHAT, json=body)
        assert r.status_code == 200, r.text
        choice_out = r.json()["choices"][0]
        assert choice_out["finish_reason"] == "tool_calls", choice_out
        calls = choice_out["message"]["tool_calls"]
        assert len(calls) == 1
        name = calls[0]["function"]["name"]
        assert name == (choice["function"]["name"] if isinstance(choice, dict) else name)
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schemas[name])
        streamed: dict[str, str] = {"name": "", "arguments": ""}
        with c.stream("POST", CHAT, json={**body, "stream": True}) as s:
            for line in s.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                assert "error" not in event, event
                for delta_call in event["choices"][0]["delta"].get("tool_calls") or ():
                    fn = delta_call.get("function", {})
                    streamed["name"] += fn.get("name") or ""
                    streamed["arguments"] += fn.get("arguments") or ""
        assert streamed == {"name": name, "arguments": calls[0]["function"]["arguments"]}
