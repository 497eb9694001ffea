"""Through a real server: the prompt's own log-probabilities (``/generate``'s
``logprob_start_len``) do not depend on the radix cache or on how the prompt is chunked."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow

PROMPT = ("Write a long story about a lighthouse keeper who counts the ships that pass. " * 40)


def score(c, text: str, start: int, top: int = 0, **extra: Any) -> dict[str, Any]:
    r = c.post("/generate", json={"text": text, "return_logprob": True,
                                  "logprob_start_len": start, "top_logprobs_num": top,
                                  "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                                  **extra})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def test_prompt_scores_are_the_same_cached_or_not_and_across_chunks(main_server) -> None:
    with main_server.client(timeout=600) as c:
        c.post("/flush_cache")
        whole = score(c, PROMPT, 0, top=2)
        n = whole["prompt_tokens"]
        assert n > 2 * 256  # (scored over several steps of at most 256 rows)
        pairs = whole["input_token_logprobs"]
        assert len(pairs) == n and pairs[0][0] is None
        assert all(isinstance(v, float) and v <= 0 for v, _, _ in pairs[1:])
        tops = whole["input_top_logprobs"]
        assert len(tops) == n and all(len(t) == 2 and t[0][0] >= t[1][0] for t in tops[1:])
        again = score(c, PROMPT, 0)  # its prefix is in the cache now; scored all the same
        assert [p[0] for p in again["input_token_logprobs"][1:]] == pytest.approx(
            [p[0] for p in pairs[1:]], abs=2e-4)
        tail = score(c, PROMPT, n - 5)  # the cache supplies all but the last few positions
        assert [t for _, t, _ in tail["input_token_logprobs"]] == [t for _, t, _ in pairs[-5:]]
        assert [p[0] for p in tail["input_token_logprobs"]] == pytest.approx(
            [p[0] for p in pairs[-5:]], abs=2e-4)
        assert tail["cached_tokens"] >= n - 6 - 16  # (whole pages of the cached prefix)
        bad = c.post("/generate", json={"text": "a b", "return_logprob": True,
                                        "logprob_start_len": 50})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprob_start_len"


def test_a_batch_of_prompts_scored_together_equals_each_alone(main_server) -> None:
    """Four prompts of ~150 tokens in one completions request (echo, logprobs, max_tokens 0:
    an evaluation harness's batch): more scored rows than one step computes, so the prompts
    are cut across steps; each prompt's scores equal its own, scored alone."""
    prompts = [f"Item {i}: " + "the quick brown fox jumps over the lazy dog. " * 15
               for i in range(4)]

    def scores(c, batch: list[str]) -> list[list[float | None]]:
        r = c.post("/v1/completions", json={"prompt": batch, "max_tokens": 0, "echo": True,
                                            "logprobs": 1})
        assert r.status_code == 200, r.text
        choices = sorted(r.json()["choices"], key=lambda ch: ch["index"])
        return [ch["logprobs"]["token_logprobs"] for ch in choices]

    with main_server.client(timeout=600) as c:
        together = scores(c, prompts)
        alone = [scores(c, [p])[0] for p in prompts]
    assert sum(len(s) for s in together) > 256
    for t, a in zip(together, alone):
        assert t[0] is None and a[0] is None and len(t) == len(a) > 100
        assert t[1:] == pytest.approx(a[1:], abs=2e-4)


def test_token_ids_logprob_on_the_prompt_and_the_output(main_server) -> None:
    """SGLang's ``token_ids_logprob``: the chosen tokens' log-probabilities at each generated
    position and, with ``logprob_start_len``, at each prompt position; the generated token's
    own value is among them when chosen."""
    with main_server.client(timeout=600) as c:
        plain = c.post("/generate", json={"text": "The sky is", "return_logprob": True,
                                          "sampling_params": {"max_new_tokens": 3,
                                                              "temperature": 0}}).json()
        first = plain["output_ids"][0]
        got = c.post("/generate", json={
            "text": "The sky is", "return_logprob": True, "logprob_start_len": 0,
            "token_ids_logprob": [first, 5], "sampling_params": {"max_new_tokens": 3,
                                                                 "temperature": 0}}).json()
        meta = got["meta_info"]
        out = meta["output_token_ids_logprobs"]
        assert len(out) == 3 and [t for _, t, _ in out[0]] == [first, 5]
        assert out[0][0][0] == pytest.approx(meta["output_token_logprobs"][0][0], abs=1e-6)
        prompt = meta["input_token_ids_logprobs"]
        assert prompt[0] is None and len(prompt) == meta["prompt_tokens"]
        assert all([t for _, t, _ in pos] == [first, 5] for pos in prompt[1:])
        bad = c.post("/generate", json={"text": "a", "return_logprob": True,
                                        "token_ids_logprob": [10 ** 9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "token_ids_logprob"


def test_score_gives_each_items_label_probabilities(main_server) -> None:
    """``/v1/score``: per item, the label tokens' probabilities as the next token after query +
    item, equal to ``/generate``'s ``token_ids_logprob`` on the same ids; with apply_softmax
    renormalized over the labels."""
    import math

    query, items, labels = [1, 504, 3485], [[314, 253], [314, 5284]], [253, 314, 29]
    with main_server.client(timeout=600) as c:
        raw = c.post("/v1/score", json={"query": query, "items": items,
                                        "label_token_ids": labels})
        assert raw.status_code == 200, raw.text
        body = raw.json()
        assert body["object"] == "scoring" and len(body["scores"]) == 2
        assert body["usage"]["prompt_tokens"] == 10
        for item, scores in zip(items, body["scores"]):
            meta = c.post("/generate", json={
                "input_ids": query + item, "return_logprob": True, "token_ids_logprob": labels,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).json()["meta_info"]
            want = [math.exp(v) for v, _, _ in meta["output_token_ids_logprobs"][0]]
            assert scores == pytest.approx(want, rel=1e-5)
        soft = c.post("/v1/score", json={"query": query, "items": items, "item_first": True,
                                         "label_token_ids": labels, "apply_softmax": True})
        assert all(sum(s) == pytest.approx(1.0) for s in soft.json()["scores"])
        text = c.post("/v1/score", json={"query": "The sky is", "items": [" blue", " green"],
                                         "label_token_ids": labels}).json()
        assert len(text["scores"]) == 2 and all(0 < v < 1 for s in text["scores"] for v in s)
        for bad, param in [({"query": "a", "items": [[1]], "label_token_ids": [1]}, "items"),
                           ({"query": [1], "items": [[1]], "label_token_ids": []},
                            "label_token_ids"),
                           ({"query": [1], "items": [[1]], "label_token_ids": [10 ** 9]},
                            "label_token_ids")]:
            r = c.post("/v1/score", json=bad)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_return_text_in_logprobs_names_each_token(main_server) -> None:
    with main_server.client(timeout=600) as c:
        meta_text = c.post("/generate", json={
            "text": "The sky is", "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": 2, "return_text_in_logprobs": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()
        meta = meta_text["meta_info"]
        assert "".join(e[2] for e in meta["output_token_logprobs"]) == meta_text["text"]
        assert "".join(e[2] for e in meta["input_token_logprobs"]) == "The sky is"
        assert all(isinstance(e[2], str) for top in meta["output_top_logprobs"] for e in top)
        plain = c.post("/generate", json={
            "text": "The sky is", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).json()
        assert plain["meta_info"]["output_token_logprobs"][0][2] is None
