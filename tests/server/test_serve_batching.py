"""Through a real server: continuous batching, the radix cache and chunked prefill change
nothing in greedy outputs; streaming, stop strings, aborts and metrics behave."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
TOPICS = ["the sea", "a red fox", "winter mornings", "the history of bread", "volcanoes",
          "a lighthouse keeper", "jazz music", "the moon landing", "honey bees", "old maps",
          "a quiet library", "mountain trains", "paper cranes", "desert rain", "city lights",
          "the first computer"]


def prompts() -> list[str]:
    """16 prompts of clearly different lengths."""
    return [f"Write about {t}. " + "Please be vivid and precise. " * (i % 6) + "Answer:"
            for i, t in enumerate(TOPICS)]


def generate(client: httpx.Client, text: str | None = None, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS,
                                                **kw.pop("sampling_params", {})}}
    if text is not None:
        body["text"] = text
    body.update(kw)
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_16_concurrent_requests_equal_one_at_a_time(main_server) -> None:
    with main_server.client() as c:
        c.post("/flush_cache")
        alone = [generate(c, p)["output_ids"] for p in prompts()]
        c.post("/flush_cache")
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda p: generate(c, p), prompts()))
    assert [r["output_ids"] for r in together] == alone
    assert all(ids for ids in alone) and any(len(ids) == MAX_TOKENS for ids in alone)
    assert len({r["meta_info"]["prompt_tokens"] for r in together}) >= 6


def test_shared_prefix_hits_the_radix_cache_with_the_same_output(main_server) -> None:
    shared = ("You are a careful assistant who answers questions about geography. "
              "Always answer in one sentence. ") * 4
    with main_server.client() as c:
        c.post("/flush_cache")
        cold = generate(c, shared + "What is the capital of Italy?")
        warm = generate(c, shared + "What is the capital of Italy?")
        other = generate(c, shared + "Where is Mount Fuji?")
        c.post("/flush_cache")
        other_cold = generate(c, shared + "Where is Mount Fuji?")
        metrics = c.get("/metrics").text
    assert cold["meta_info"]["cached_tokens"] == 0
    assert warm["meta_info"]["cached_tokens"] >= warm["meta_info"]["prompt_tokens"] - 1
    assert warm["output_ids"] == cold["output_ids"]
    assert other["meta_info"]["cached_tokens"] >= 60
    assert other["output_ids"] == other_cold["output_ids"]
    cached = [line for line in metrics.splitlines()
              if line.startswith("engine_cached_tokens_total")]
    assert cached and float(cached[0].split()[-1]) > 0


def test_chunked_prefill_gives_the_same_output(main_server, aux_server) -> None:
    text = "Here is a list of facts about the ocean, the weather and the stars. " * 6
    with main_server.client() as c:
        whole = generate(c, text, sampling_params={"max_new_tokens": 12})
    with aux_server.client() as c:
        assert c.get("/get_server_info").json()["runtime"]["chunked_prefill_size"] == 16
        chunked = generate(c, text, sampling_params={"max_new_tokens": 12})
    assert chunked["meta_info"]["prompt_tokens"] > 4 * 16
    assert chunked["output_ids"] == whole["output_ids"]


def test_stream_equals_the_whole_response_and_ends_with_done(main_server) -> None:
    with main_server.client() as c:
        whole = generate(c, "List three fruits:")
        events = []
        with c.stream("POST", "/generate", json={
                "text": "List three fruits:", "stream": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS}}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["text"] == whole["text"] and last["output_ids"] == whole["output_ids"]
    assert last["meta_info"]["finish_reason"] == {"type": "length"}
    assert len(events) >= 3


def test_stop_strings_and_ids_end_the_output(main_server) -> None:
    with main_server.client() as c:
        free = generate(c, "Count: 1, 2, 3,", sampling_params={"max_new_tokens": 12})
        text = free["text"]
        assert len(text) > 6
        stop = text[3:6]
        cut = generate(c, "Count: 1, 2, 3,", sampling_params={"max_new_tokens": 12,
                                                               "stop": [stop]})
        by_id = generate(c, "Count: 1, 2, 3,", sampling_params={
            "max_new_tokens": 12, "stop_token_ids": [free["output_ids"][2]]})
    assert cut["text"] == text[:text.index(stop)]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert by_id["output_ids"] == free["output_ids"][:3]
    assert by_id["meta_info"]["finish_reason"]["matched"] == free["output_ids"][2]


def test_seeded_sampling_repeats_and_n_gives_several(main_server) -> None:
    params = {"temperature": 1.0, "top_p": 0.9, "seed": 7, "max_new_tokens": 6}
    with main_server.client() as c:
        a = generate(c, "Tell me a story:", sampling_params=params)
        b = generate(c, "Tell me a story:", sampling_params=params)
        many = c.post("/generate", json={"text": "Tell me a story:",
                                         "sampling_params": {**params, "n": 3}}).json()
    assert a["output_ids"] == b["output_ids"]
    assert len(many) == 3 and many[0]["output_ids"] == a["output_ids"]
    assert len({tuple(m["output_ids"]) for m in many}) > 1


def _running_drops_to_zero(client, within: float) -> bool:
    """Poll the scheduler until no request runs (True) or ``within`` seconds pass (False)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if client.get("/get_server_info").json()["scheduler"]["num_running"] == 0:
            return True
        time.sleep(0.2)
    return False


def test_client_disconnect_aborts_the_request(main_server) -> None:
    with main_server.client() as c:
        with c.stream("POST", "/generate", json={
                "text": "Write a very long essay:", "stream": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": 2000}}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
        assert _running_drops_to_zero(c, within=30)
        metrics = c.get("/metrics").text
    assert 'finish_reason="abort"' in metrics


def test_client_leaving_a_non_streamed_request_aborts_it(main_server) -> None:
    """Tokens keep coming for this request; the disconnect is still noticed within a second."""
    with main_server.client() as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post("/generate", timeout=2.0, json={
                "text": "Write a very long essay:",
                "sampling_params": {"temperature": 0, "max_new_tokens": 2000,
                                    "ignore_eos": True}})
        assert _running_drops_to_zero(c, within=20)


def test_info_health_and_metrics_routes(main_server) -> None:
    with main_server.client() as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").status_code == 200
        info = c.get("/get_model_info").json()
        assert info["is_generation"] and info["context_length"] == 8192
        server = c.get("/get_server_info").json()
        assert server["max_running_requests"] == 16 and "scheduler" in server
        metrics = c.get("/metrics").text
    for name in ("engine_requests_total", "engine_generation_tokens_total",
                 "engine_num_queue_requests", "engine_num_running_requests",
                 "engine_time_to_first_token_seconds_bucket",
                 "engine_inter_token_latency_seconds_bucket", "engine_kv_cache_usage",
                 "engine_kernel_builds_after_ready"):
        assert name in metrics, name
