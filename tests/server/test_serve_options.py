"""Options whose behaviour shows over HTTP, on one extra server started with all of them:
an inline chat template, stream interval, incremental /generate streams, cache report,
auto-truncation, request logging, preferred sampling parameters, accepted no-op options, the
fill-in-the-middle completion template; and what a server refuses while embeddings and custom
logit processors are off."""

from __future__ import annotations

import json
import time
from typing import Iterator

import pytest

from conftest import Server, running, start_server

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running(start_server(
            "options", "--context-length", "256", "--chat-template", TEMPLATE,
            "--stream-interval", "4", "--incremental-streaming-output",
            "--enable-cache-report", "--allow-auto-truncate", "--log-requests",
            "--log-requests-level", "3", "--log-requests-format", "json",
            "--enable-request-time-stats-logging",
            "--preferred-sampling-params", '{"temperature": 0}',
            "--schedule-policy", "priority", "--tp-size", "1", "--trust-remote-code",
            "--completion-template", "star_coder")) as s:
        yield s["options"]


def _events(resp) -> list:
    return [json.loads(line[6:]) for line in resp.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_inline_chat_template_and_cache_report(server):
    with server.client() as c:
        body = {"messages": [{"role": "user", "content": "Quiet meadows hum softly"}],
                "max_tokens": 4}
        first = c.post("/v1/chat/completions", json=body).json()
        again = c.post("/v1/chat/completions", json=body).json()
        ids = c.post("/generate", json={"text": "Quiet meadows hum softly", "sampling_params":
                                        {"max_new_tokens": 1}}).json()
    assert first["usage"]["prompt_tokens"] == ids["meta_info"]["prompt_tokens"], \
        "the prompt is the template's rendering: the content alone"
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, again)]
    assert cached[1] > cached[0], cached
    assert first["choices"][0]["message"] == again["choices"][0]["message"], \
        "preferred temperature 0: greedy"


def test_stream_interval_and_incremental_generate(server):
    with server.client() as c:
        with c.stream("POST", "/v1/completions", json={
                "prompt": "Once upon a time", "max_tokens": 12, "stream": True,
                "logprobs": 0}) as r:
            chunks = _events(r)
        with c.stream("POST", "/generate", json={
                "text": "Once upon a time", "stream": True,
                "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}) as r:
            items = _events(r)
    sizes = [len(ch["choices"][0]["logprobs"]["tokens"]) for ch in chunks
             if ch["choices"] and ch["choices"][0]["logprobs"]]
    assert sum(sizes) == 12 and all(n >= 4 for n in sizes[:-1]), sizes
    assert sum(len(i["output_ids"]) for i in items) == 12, "disjoint segments add up"
    assert all(len(i["output_ids"]) <= 4 for i in items)


def test_auto_truncate_and_request_log(server):
    with server.client() as c:
        r = c.post("/v1/completions", json={"prompt": "word " * 400, "max_tokens": 8,
                                            "rid": "long-one"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 256 - 8
    time.sleep(0.5)
    log = open(server.log_path, errors="replace").read()
    line = next(ln for ln in log.splitlines()
                if '"rid": "long-one"' in ln and "sampling_params" in ln)
    record = json.loads(line[line.index("{"):])
    assert record["prompt_tokens"] == 248 and record["sampling_params"]["temperature"] == 0
    assert record["input"].startswith("word") and "output" in record
    line = next(ln for ln in log.splitlines() if '"rid": "long-one"' in ln and '"queue"' in ln)
    times = json.loads(line[line.index("{"):])
    assert times["prompt_tokens"] == 248 and times["completion_tokens"] == 8
    phases = ("queue", "prefill", "handover", "ttft", "decode", "e2e")
    assert all(times[k] >= 0 for k in phases), times
    assert times["queue"] + times["prefill"] + times["handover"] <= times["ttft"] + 1e-6
    assert times["prefill"] > 0 and times["ttft"] + times["decode"] <= times["e2e"] + 1e-6
    assert "--tp-size 1 is accepted and changes nothing here" in log
    assert "--trust-remote-code is accepted and changes nothing here" in log


def test_suffix_goes_through_the_completion_template(server):
    prompt, suffix = "def add(a, b):\n    ", "\n    return total\n"
    joined = f"<fim_prefix>{prompt}<fim_suffix>{suffix}<fim_middle>"
    with server.client() as c:
        fim = c.post("/v1/completions", json={"prompt": prompt, "suffix": suffix,
                                              "max_tokens": 6}).json()
        plain = c.post("/generate", json={"text": joined,
                                          "sampling_params": {"max_new_tokens": 6}}).json()
        ids = c.post("/v1/completions", json={"prompt": [1, 2, 3], "suffix": suffix})
    assert fim["usage"]["prompt_tokens"] == plain["meta_info"]["prompt_tokens"]
    assert fim["choices"][0]["text"] == plain["text"], "greedy: the same prompt, the same text"
    assert ids.status_code == 400 and ids.json()["error"]["param"] == "suffix"


def test_embeddings_and_logit_processors_are_refused_when_off(server):
    with server.client() as c:
        emb = c.post("/v1/embeddings", json={"input": "Hi"})
        proc = c.post("/v1/completions", json={
            "prompt": "Hi", "max_tokens": 2,
            "custom_logit_processor": '{"callable": "disallowed_tokens"}'})
    assert emb.status_code == 400 and "--is-embedding" in emb.json()["error"]["message"]
    assert proc.status_code == 400
    assert proc.json()["error"]["param"] == "custom_logit_processor"
    assert "--enable-custom-logit-processor" in proc.json()["error"]["message"]
