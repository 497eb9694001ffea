"""The overlap scheduler (each step's tokens drawn on the device and read back after the next
step is launched) gives exactly what reading them back at once gives, on the real default
model: greedy and seeded sampled tokens, text, stop strings, log-probabilities, finish reasons
and counts, for a mix of requests that join while others run - including requests whose
sampling reads their generated tokens (penalties), which make their steps read back at once.
On CPU the forward is synchronous, so ``ENGINE_OVERLAP_SCHEDULE=1`` forces the overlap path."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from _default_model import default_runner
from engine import Engine
from engine.runtime.request import Req, ReqOutput
from engine.runtime.sampling import SamplingParams

pytestmark = pytest.mark.slow

_ids = itertools.count()

#: (prompt, sampling params, step at which it is submitted)
MIX: list[tuple[str, dict[str, Any], int]] = [
    ("The capital of France is", {"temperature": 0.0, "max_new_tokens": 12,
                                  "ignore_eos": True}, 0),
    ("Once upon a time", {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 7,
                          "max_new_tokens": 10, "ignore_eos": True, "n": 2}, 0),
    ("def add(a, b):", {"temperature": 0.0, "max_new_tokens": 16, "stop": ["\n"]}, 1),
    ("My favourite colour is", {"temperature": 0.0, "max_new_tokens": 6, "logprobs": True,
                                "top_logprobs": 3, "ignore_eos": True}, 2),
    ("Water boils at", {"temperature": 0.0, "max_new_tokens": 1}, 3),
    ("List three fruits:", {"temperature": 0.0, "max_new_tokens": 8,
                            "frequency_penalty": 0.5, "ignore_eos": True}, 9),
    ("In 1969, astronauts", {"temperature": 0.7, "seed": 3, "min_p": 0.05,
                             "max_new_tokens": 7, "ignore_eos": True}, 6),
    ("Hello", {"temperature": 0.0, "max_new_tokens": 0}, 7),
]


def run_mix(monkeypatch: pytest.MonkeyPatch, mode: str) -> tuple[dict[str, Any], int]:
    """Outputs per request of :data:`MIX` and how many steps left a step in flight."""
    monkeypatch.setenv("ENGINE_OVERLAP_SCHEDULE", mode)
    engine = Engine(runner=default_runner())
    sched = engine.runtime.scheduler
    assert sched.overlap is (mode == "1")
    outs: dict[str, list[ReqOutput]] = {}
    reqs: list[tuple[int, Req]] = []
    pending = list(enumerate(MIX))
    step = in_flight = 0
    while pending or sched.has_work:
        for k, (prompt, sp, at) in list(pending):
            if at <= step:
                pending.remove((k, (prompt, sp, at)))
                params = SamplingParams(**sp).validate()
                rid = f"m{next(_ids)}"
                made = engine.runtime.make_reqs(rid, engine.tokenizer.encode(prompt), params,
                                                lambda o: outs.setdefault(o.rid, []).append(o))
                sched.submit(made)
                reqs += [(k, r) for r in made]
        sched.step()
        in_flight += sched._inflight is not None
        step += 1
        assert step < 500, "the scheduler did not go idle"
    result = {}
    for k, req in reqs:
        chunks = outs[req.rid]
        assert chunks[-1].finished and all(not c.finished for c in chunks[:-1])
        last = chunks[-1]
        result[f"{k}/{req.rid.rsplit('-', 1)[-1] if '-' in req.rid else 0}"] = {
            "tokens": [t for c in chunks for t in c.token_ids],
            "text": "".join(c.text for c in chunks),
            "logprobs": [round(v, 4) for c in chunks for v in c.logprobs],
            "top": [[(t, round(v, 4)) for t, v in row] for c in chunks for row in c.top_logprobs],
            "finish": last.finish_reason, "completion": last.completion_tokens,
            "prompt": last.prompt_tokens}
    sched.flush_cache()
    sched.step()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens
    assert sched.rows.num_free == sched.max_running and sched._inflight is None
    return result, in_flight


def test_overlap_gives_what_reading_back_at_once_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    sync, none_in_flight = run_mix(monkeypatch, "0")
    overlap, in_flight = run_mix(monkeypatch, "1")
    assert none_in_flight == 0 and in_flight >= 8  # it did overlap
    assert overlap == sync
    # the mix covers what it should
    assert sync["2/0"]["finish"] == {"type": "stop", "matched": "\n"}
    assert sync["4/0"]["completion"] == 1 and sync["7/0"]["completion"] == 0
    assert len(sync["3/0"]["top"]) == 6 and all(len(r) == 3 for r in sync["3/0"]["top"])
    assert sync["1/0"]["tokens"] != sync["1/1"]["tokens"]  # n=2: two seeded sequences


def test_abort_of_a_request_in_flight_returns_its_memory(monkeypatch) -> None:
    monkeypatch.setenv("ENGINE_OVERLAP_SCHEDULE", "1")
    engine = Engine(runner=default_runner())
    sched = engine.runtime.scheduler
    outs: list[ReqOutput] = []
    params = SamplingParams(temperature=0.0, max_new_tokens=50, ignore_eos=True).validate()
    req, = engine.runtime.make_reqs("a", engine.tokenizer.encode("Count: 1, 2, 3,"), params,
                                    outs.append)
    sched.submit([req])
    for _ in range(4):
        sched.step()
    assert sched._inflight is not None and req.unresolved == 1
    sched.abort([req])
    sched.step()
    assert outs[-1].finish_reason["type"] == "abort"
    assert outs[-1].completion_tokens == len(req.output_ids) == sum(len(o.token_ids)
                                                                     for o in outs)
    while sched.step():
        pass
    sched.flush_cache()
    sched.step()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens
