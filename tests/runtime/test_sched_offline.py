"""The offline Engine over the real default model: the scheduler's batches (continuous
batching, chunked prefill, retraction under a tiny KV budget) give the same greedy tokens as
plain runner batches, and sampling options behave."""

from __future__ import annotations

import pytest

from _default_model import default_runner, greedy
from engine import Engine

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time, in a small village"]
STEPS = 6


@pytest.fixture(scope="module")
def runner():
    return default_runner()


@pytest.fixture(scope="module")
def reference(runner) -> list[list[int]]:
    ids = [runner.tokenizer.encode(p) for p in PROMPTS]
    return [greedy(runner, [i], STEPS)[0][0] for i in ids]


def engine(runner, **kw) -> Engine:
    # the radix cache stays off: other test modules write the same pool between these tests
    return Engine(runner=runner, disable_radix_cache=True, **kw)


GREEDY = {"temperature": 0, "max_new_tokens": STEPS, "ignore_eos": True}


def test_batched_chunked_generate_equals_the_runner_alone(runner, reference) -> None:
    out = engine(runner, chunked_prefill_size=4).generate(PROMPTS, GREEDY)
    assert [o["output_ids"] for o in out] == reference
    assert all(o["finish_reason"] == {"type": "length"} for o in out)
    assert out[0]["text"] == runner.tokenizer.decode(reference[0])
    assert out[0]["meta_info"]["completion_tokens"] == STEPS


def test_generate_takes_token_ids_and_per_prompt_params(runner, reference) -> None:
    ids = runner.tokenizer.encode(PROMPTS[0])
    out = engine(runner).generate([ids, ids], [GREEDY, {**GREEDY, "max_new_tokens": 3}])
    assert out[0]["output_ids"] == reference[0]
    assert out[1]["output_ids"] == reference[0][:3]


def test_seed_n_and_logprobs(runner) -> None:
    e = engine(runner)
    sp = {"temperature": 0.9, "top_k": 50, "seed": 11, "max_new_tokens": 4, "n": 2,
          "logprobs": True, "top_logprobs": 2}
    a, b = e.generate(PROMPTS[2], sp), e.generate(PROMPTS[2], sp)
    assert len(a) == 2 and [x["output_ids"] for x in a] == [x["output_ids"] for x in b]
    lp = a[0]["meta_info"]["output_token_logprobs"]
    assert len(lp) == len(a[0]["output_ids"]) and all(v <= 0 for v in lp)
    assert len(a[0]["meta_info"]["output_top_logprobs"][0]) == 2


def test_stop_string_is_cut(runner, reference) -> None:
    text = runner.tokenizer.decode(reference[2])
    stop = text[5:8]
    out = engine(runner).generate(PROMPTS[2], {**GREEDY, "stop": stop})[0]
    assert out["text"] == text[:text.index(stop)]
    assert out["finish_reason"] == {"type": "stop", "matched": stop}


def test_tiny_kv_budget_retracts_and_keeps_outputs(runner, reference) -> None:
    e = engine(runner, chunked_prefill_size=8)
    sched = e.runtime.scheduler
    usable = sum(len(runner.tokenizer.encode(p)) for p in PROMPTS) + 6
    sched.allocator.num_pages = (usable + 1) // runner.page_size + 1  # shrink the budget
    sched.allocator.reset()
    out = e.generate(PROMPTS, GREEDY)
    assert [o["output_ids"] for o in out] == reference
    assert sched.num_retractions > 0
