"""Bad input answers 4xx with an OpenAI-style error naming the problem; the server goes on.
Also: 503 (with ``Retry-After``) beyond ``--max-queued-requests`` and 401 without the API
key."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "Hi"}]

CASES = [
    # (id, path, body (dict or raw bytes), status, param, words in the message)
    ("invalid-json", CHAT, b'{"messages": [', 400, None, "not valid JSON"),
    ("not-an-object", CHAT, b"[1, 2]", 400, None, "JSON object"),
    ("missing-messages", CHAT, {"max_tokens": 2}, 400, "messages", "missing"),
    ("missing-prompt", COMPL, {"max_tokens": 2}, 400, "prompt", "missing"),
    ("wrong-type", CHAT, {"messages": MSG, "max_tokens": "many"}, 400, "max_tokens",
     "integer"),
    ("bad-role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages",
     "role"),
    ("negative-max-tokens", COMPL, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens", ">= 0"),
    ("max-tokens-beyond-context", COMPL, {"prompt": "x", "max_tokens": 10**6}, 400,
     "max_tokens", "context length"),
    ("negative-temperature", CHAT, {"messages": MSG, "temperature": -0.5}, 400, "temperature",
     "temperature"),
    ("top-p-zero", CHAT, {"messages": MSG, "top_p": 0}, 400, "top_p", "top_p"),
    ("top-p-above-one", COMPL, {"prompt": "x", "top_p": 1.5}, 400, "top_p", "top_p"),
    ("empty-messages", CHAT, {"messages": []}, 400, "messages", "at least 1"),
    ("unknown-model", CHAT, {"model": "gpt-9", "messages": MSG}, 404, "model", "gpt-9"),
    ("prompt-beyond-context", COMPL, {"prompt": [5] * 8300, "max_tokens": 1}, 400, "prompt",
     "context length"),
    ("token-id-outside-vocab", "/generate", {"input_ids": [1, 10**9]}, 400, "input_ids",
     "token ids"),
    ("text-and-ids", "/generate", {"text": "a", "input_ids": [1]}, 400, "input_ids",
     "exactly one"),
    ("bad-tool-choice", CHAT, {"messages": MSG, "tool_choice": "sometimes"}, 400,
     "tool_choice", "tool_choice"),
    ("template-kwargs-set-a-render-argument", CHAT,
     {"messages": MSG, "chat_template_kwargs": {"tokenize": False}}, 400,
     "chat_template_kwargs", "may not set tokenize"),
    ("empty-body", COMPL, b"", 400, None, "the request body is empty; expected a JSON object"),
    ("invalid-utf8", COMPL, b'{"prompt": "\xff"}', 400, None, "not valid UTF-8"),
    ("deep-nesting", CHAT, b'{"messages": ' + b"[" * 80 + b"]" * 80 + b"}", 400, None,
     "deeper than 64 levels"),
    ("nesting-beyond-the-parser", CHAT, b"[" * 100_000, 400, None, "deeper than 64 levels"),
    ("stream-options-not-an-object", CHAT, {"messages": MSG, "stream": True,
                                            "stream_options": "yes"}, 400, "stream_options",
     "stream_options: expected a JSON object"),
    ("negative-max-completion-tokens", CHAT, {"messages": MSG, "max_completion_tokens": -5},
     400, "max_completion_tokens", "max_completion_tokens must be >= 0"),
    ("lone-surrogate-prompt", COMPL, b'{"prompt": "a\\ud800", "stream": true}', 400,
     "prompt", "lone surrogate"),
    ("lone-surrogate-key", COMPL, b'{"prompt": "a", "\\udc00": 1}', 400, None,
     "lone surrogate"),
    ("logit-bias-beyond-range", CHAT, {"messages": MSG, "logit_bias": {"42": 101}}, 400,
     "logit_bias", "must be a number in [-100, 100]"),
    ("logit-bias-key-not-a-token", COMPL, {"prompt": "x", "logit_bias": {"forty": 1}}, 400,
     "logit_bias", "keys must be token ids, got 'forty'"),
    ("logit-bias-key-beyond-vocabulary", COMPL, {"prompt": "x", "logit_bias": {"49152": 1}},
     400, "logit_bias", "below the vocabulary size 49152"),
    ("logit-bias-not-an-object", CHAT, {"messages": MSG, "logit_bias": [1, 2]}, 400,
     "logit_bias", "logit_bias"),
    ("best-of", COMPL, {"prompt": "x", "best_of": 2}, 400, "best_of", "not supported"),
    ("response-format-without-schema", CHAT, {"messages": MSG, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x"}}}, 400, "response_format",
     "needs json_schema.schema"),
    ("response-format-bogus", COMPL, {"prompt": "x", "response_format": {"type": "?"}}, 400,
     "response_format", "'json_schema'"),
    ("two-constraints", COMPL, {"prompt": "x", "regex": "a+", "ebnf": 'root ::= "a"'}, 400,
     "ebnf", "at most one constraint"),
    ("tool-parameters-not-a-schema", CHAT, {"messages": MSG, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": [1]}}]}, 400, "tools",
     "JSON schema"),
    ("n-beyond-limit", COMPL, {"prompt": "x", "n": 2000}, 400, "n",
     "--max-sequences-per-request"),
    ("stop-strings-beyond-limit", COMPL, {"prompt": "x", "stop": ["s" * 2000] * 1000}, 400,
     "stop", "--max-stop-strings"),
]


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return client.post(path, content=body, headers={"content-type": "application/json"})
    return client.post(path, json=body)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_with_an_error_object(main_server, case) -> None:
    _, path, body, status, param, words = case
    with main_server.client() as c:
        r = post(c, path, body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "param", "code"}
        assert err["param"] == param
        assert words.lower() in err["message"].lower(), err["message"]
        ok = c.post(COMPL, json={"prompt": "Hello", "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] is not None


def test_oversized_body_is_413_and_the_server_goes_on(main_server) -> None:
    with main_server.client() as c:
        r = c.post(COMPL, content=b'{"prompt": "' + b"a" * (9 * 2**20) + b'"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
        assert c.get("/v1/models").status_code == 200


def test_unknown_route_is_404_with_an_error_object(main_server) -> None:
    with main_server.client() as c:
        r = c.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_beyond_max_queued_requests_is_503(aux_server) -> None:
    body = {"text": "Write a poem:", "sampling_params": {"temperature": 0,
                                                         "max_new_tokens": 24}}
    with aux_server.client() as c:
        r = c.post("/generate", json={**body, "sampling_params": {
            **body["sampling_params"], "n": 3}})
        assert r.status_code == 503, r.text
        assert "max-queued-requests" in r.json()["error"]["message"]
        assert r.headers["retry-after"].isdigit()
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: c.post("/generate", json=body).status_code,
                                  range(8)))
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
        assert c.post("/generate", json=body).status_code == 200


def test_api_key_protects_every_route_but_health(aux_server) -> None:
    url = aux_server.url
    assert httpx.get(url + "/health").status_code == 200
    for path in ("/v1/models", "/metrics", "/get_server_info", "/health_generate"):
        r = httpx.get(url + path)
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error"
    bad = httpx.post(url + "/generate", json={"text": "a"},
                     headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401
    good = httpx.get(url + "/v1/models", headers=aux_server.headers())
    assert good.status_code == 200


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_tool_choice_is_validated_and_enforced(aux_server) -> None:
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6,
            "temperature": 0, "tools": TOOLS}
    with aux_server.client() as c:
        auto = c.post(CHAT, json={**body, "tool_choice": "auto"})
        assert auto.status_code == 200, auto.text
        choice = auto.json()["choices"][0]
        assert "tool_calls" not in choice["message"] and choice["finish_reason"] != "tool_calls"
        named = c.post(CHAT, json={**body, "tool_choice": {
            "type": "function", "function": {"name": "nope"}}})
        assert named.status_code == 400 and named.json()["error"]["param"] == "tool_choice"
        required = c.post(CHAT, json={**body, "tool_choice": "required"})
        assert required.status_code == 400
        assert "no valid tool call" in required.json()["error"]["message"]
        no_tools = c.post(CHAT, json={**body, "tools": None, "tool_choice": "required"})
        assert no_tools.status_code == 400 and "needs tools" in no_tools.json()["error"][
            "message"]
