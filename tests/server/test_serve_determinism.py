"""One server with ``--enable-deterministic-inference`` and ``--enable-custom-logit-processor``:
a request's greedy tokens and logprobs are bit-identical alone and batched with others of
different lengths; named logit processors change the output, serialized code is refused."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from conftest import Server, running, start_server

PROMPT = "The three primary colours are"
OTHERS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 3, "Hi"]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running(start_server("deterministic", "--enable-deterministic-inference",
                              "--enable-custom-logit-processor", "--max-running-requests",
                              "8")) as s:
        yield s["deterministic"]


def _params(max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}


def _generate(server: Server, text, params, **extra) -> dict | list:
    with server.client() as c:
        r = c.post("/generate", json={"text": text, "sampling_params": params,
                                      "return_logprob": True, "top_logprobs_num": 3, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _trace(item: dict) -> tuple:
    meta = item["meta_info"]
    return item["output_ids"], meta["output_token_logprobs"], meta["output_top_logprobs"]


def test_alone_and_batched_are_bit_identical(server):
    alone = _trace(_generate(server, PROMPT, _params(12)))
    with server.client() as c:
        assert c.post("/flush_cache").status_code == 200  # the batch prefills the prompt anew
    batch = _generate(server, [OTHERS[0], PROMPT, OTHERS[1]],
                      [_params(20), _params(12), _params(3)])
    assert _trace(batch[1]) == alone, "the same tokens and the same float logprobs"
    with ThreadPoolExecutor(3) as pool:  # whatever batches the scheduler makes of these
        futures = [pool.submit(_generate, server, text, _params(n))
                   for text, n in ((OTHERS[0], 24), (PROMPT, 12), (OTHERS[1], 6))]
        concurrent = [f.result() for f in futures]
    assert _trace(concurrent[1]) == alone


def test_a_named_processor_changes_the_output(server):
    plain = _generate(server, PROMPT, _params(8))["output_ids"]
    banned = sorted(set(plain))
    spec = json.dumps({"callable": "disallowed_tokens"})
    out = _generate(server, PROMPT, {**_params(8), "custom_params": {"token_ids": banned}},
                    custom_logit_processor=spec)["output_ids"]
    assert len(out) == 8 and not set(out) & set(banned)
    with server.client() as c:
        chat = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4,
            "temperature": 0, "logprobs": True,
            "custom_logit_processor": {"callable": "disallowed_tokens"},
            "custom_params": {"token_ids": banned}})
    assert chat.status_code == 200, chat.text


@pytest.mark.parametrize("extra,param,words", [
    ({"custom_logit_processor": json.dumps({"callable": "80049512" + "ab" * 40})},
     "custom_logit_processor", "serialized Python code"),
    ({"custom_logit_processor": {"callable": "no_such"}}, "custom_logit_processor",
     "registered: disallowed_tokens"),
    ({"custom_logit_processor": {"callable": "disallowed_tokens"}, "custom_params": [1]},
     "custom_params", "JSON object"),
    ({"custom_logit_processor": {"callable": "disallowed_tokens"},
      "custom_params": {"token_ids": [10**9]}}, "custom_params", "token ids below"),
    ({"custom_params": {"token_ids": [1]}}, "custom_params", "names none"),
    ({"suffix": "x"}, "suffix", "--completion-template"),
])
def test_refused_requests_are_400_naming_the_field(server, extra, param, words):
    with server.client() as c:
        r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
