"""Acceptance of the hierarchical KV cache with the default model on ``engine serve``.

One server with a device pool of two prompts, a host tier of three and the file store behind
it: a prompt evicted from the device comes back from the host tier, one evicted from the host
too comes back from the store, each with the output it had when computed, fewer prefill tokens
(``cached_tokens``) and the tier named (``cached_tokens_details``). Then the server restarts on
the same directory and the first repeat of an earlier prompt is a storage hit.
"""

from __future__ import annotations

import json

from conftest import running, start_server

PROMPT_TOKENS = 150  #: 9 whole pages of 16 are cached per request (and 6 tokens beyond)


def prompt(i: int) -> list[int]:
    """Token ids, different from the first one on."""
    return [100 + (i * 389 + k * 37) % 3000 for k in range(PROMPT_TOKENS)]


def ask(server, i: int) -> dict:
    with server.client() as c:
        r = c.post("/generate", json={"input_ids": prompt(i), "sampling_params": {
            "temperature": 0, "max_new_tokens": 8}})
    assert r.status_code == 200, r.text
    body = r.json()
    return {"output_ids": body["output_ids"], **body["meta_info"]}


def hicache_server(name: str, store_dir: str):
    extra = json.dumps({"path": store_dir, "prefetch_threshold": 16})
    return start_server(name, "--enable-hierarchical-cache", "--page-size", "16",
                        "--max-total-tokens", "352", "--hicache-ratio", "1.5",
                        "--hicache-storage-backend", "file",
                        "--hicache-storage-backend-extra-config", extra,
                        "--hicache-storage-prefetch-policy", "wait_complete",
                        "--max-running-requests", "2")


def test_host_and_storage_hits_then_a_restart_hits_storage(tmp_path) -> None:
    store = str(tmp_path / "pages")
    with running(hicache_server("hicache", store)) as servers:
        s = servers["hicache"]
        first = {i: ask(s, i) for i in (0, 1, 2)}  # the device holds two: 0 is evicted
        for i in (0, 1, 2):
            assert first[i]["prompt_tokens"] == PROMPT_TOKENS
            assert first[i]["cached_tokens"] == 0
        again = ask(s, 0)
        assert again["output_ids"] == first[0]["output_ids"]
        tiers = again["cached_tokens_details"]
        assert tiers["host"] == 144 and tiers["device"] == tiers["storage"] == 0
        assert again["cached_tokens"] == tiers["host"]
        ask(s, 3)  # the host tier (three prompts) gives up prompt 1; the store still has it
        back = ask(s, 1)
        assert back["output_ids"] == first[1]["output_ids"]
        assert back["cached_tokens_details"]["storage"] == 144
        with s.client() as c:
            metrics = c.get("/metrics").text
        for tier in ("host", "storage"):
            assert f'engine_cached_tokens_by_tier_total{{model_name="' in metrics
            line = next(x for x in metrics.splitlines()
                        if x.startswith("engine_cached_tokens_by_tier_total")
                        and f'tier="{tier}"' in x)
            assert float(line.rsplit(" ", 1)[1]) == 144
    with running(hicache_server("hicache-restarted", store)) as servers:
        after = ask(servers["hicache-restarted"], 2)
        assert after["output_ids"] == first[2]["output_ids"]
        tiers = after["cached_tokens_details"]
        assert tiers["storage"] == 144 and tiers["device"] == tiers["host"] == 0
