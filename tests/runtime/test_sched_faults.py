"""Failure isolation with the real default model: a fault injected into one phase of one
request's work (admission, slot taking, sampling, finishing, delivery) fails that request
alone, and a fault in a forward fails that forward's requests once; the others' greedy
outputs equal their solo outputs, the KV pool comes back whole, and later requests work."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from _default_model import default_runner
from engine import Engine
from engine.runtime import sampling
from engine.runtime.request import Req, ReqOutput
from engine.runtime.sampling import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time, in a small village",
           "My favourite colour is"]
LATER = "Water boils at"
LONG = "In 1969, astronauts " + "walked on the moon and came back home safely. " * 16
STEPS = 6
GREEDY = {"temperature": 0.0, "max_new_tokens": STEPS, "ignore_eos": True}
#: the neighbours of the faulty request: plain greedy, and greedy with penalties
OTHERS = [(PROMPTS[1], {}), (PROMPTS[2], {"frequency_penalty": 0.5, "presence_penalty": 0.3}),
          (PROMPTS[3], {})]

_ids = itertools.count()


@pytest.fixture(autouse=True, params=["sync", "overlap"])
def schedule_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each fault with tokens read back at once, and with the overlap scheduler (forced on
    CPU): a request whose token is still in flight when it fails must fail just the same."""
    monkeypatch.setenv("ENGINE_OVERLAP_SCHEDULE", "1" if request.param == "overlap" else "0")
    return request.param


class Run:
    """One offline engine over the shared runner, stepped by hand; outputs per request."""

    def __init__(self, runner: Any) -> None:
        self.engine = Engine(runner=runner)
        self.sched = self.engine.runtime.scheduler
        self.outs: dict[str, list[ReqOutput]] = {}

    def submit(self, prompt: str, **sp: Any) -> Req:
        rid = f"r{next(_ids)}"
        self.outs[rid] = []
        params = SamplingParams(**{**GREEDY, **sp}).validate()
        ids = self.engine.tokenizer.encode(prompt)
        req, = self.engine.runtime.make_reqs(rid, ids, params, self.outs[rid].append)
        self.sched.submit([req])
        return req

    def drain(self) -> None:
        for _ in range(1000):
            if not self.sched.step():
                return
        pytest.fail("the scheduler did not go idle")

    def tokens(self, req: Req) -> list[int]:
        return [t for o in self.outs[req.rid] for t in o.token_ids]

    def last(self, req: Req) -> ReqOutput:
        outs = self.outs[req.rid]
        assert outs and outs[-1].finished, f"{req.rid} did not finish"
        return outs[-1]

    def assert_kv_returned(self) -> None:
        self.sched.flush_cache()
        assert not self.sched.step()  # drains the flush
        alloc = self.sched.allocator
        assert alloc.free_tokens == alloc.capacity_tokens
        assert self.sched.rows.num_free == self.sched.max_running
        assert not self.sched.running and self.sched.chunked is None


@pytest.fixture(scope="module")
def runner():
    return default_runner()


@pytest.fixture(scope="module")
def solo(runner):
    """Greedy output of a prompt run alone, memoised per (prompt, params)."""
    memo: dict[tuple[str, str], list[int]] = {}

    def get(prompt: str, **sp: Any) -> list[int]:
        key = (prompt, repr(sorted(sp.items())))
        if key not in memo:
            run = Run(runner)
            req = run.submit(prompt, **sp)
            run.drain()
            memo[key] = run.tokens(req)
            assert run.last(req).finish_reason == {"type": "length"}
        return memo[key]

    return get


def assert_failed(run: Run, req: Req, words: str) -> None:
    reason = run.last(req).finish_reason
    assert reason["type"] == "abort" and words in reason["message"], reason


def assert_others_and_later_fine(run: Run, others: list[Req], solo) -> None:
    for req, (prompt, sp) in zip(others, OTHERS):
        assert run.last(req).finish_reason == {"type": "length"}
        assert run.tokens(req) == solo(prompt, **sp)
    run.assert_kv_returned()
    later = run.submit(LATER)
    run.drain()
    assert run.tokens(later) == solo(LATER)
    run.assert_kv_returned()


def _slots_fault(run: Run, victim: Req, when) -> None:
    real = run.sched._take_slots

    def take(req: Req, n: int):
        if req is victim and when(req):
            raise RuntimeError("injected slot fault")
        return real(req, n)

    run.sched._take_slots = take  # type: ignore[method-assign]


def _sampling_fault(monkeypatch, victim: Req) -> None:
    real = sampling._apply_penalties

    def apply(logits, row, vocab):
        if row is victim and len(row.output_ids) >= 2:
            raise RuntimeError("injected sampling fault")
        real(logits, row, vocab)

    monkeypatch.setattr(sampling, "_apply_penalties", apply)


class FaultyDetok:
    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def add(self, tok: int) -> str:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("injected detokenizer fault")
        return self.inner.add(tok)

    def finish(self) -> str:
        return self.inner.finish()


def _emit_fault(run: Run, victim: Req) -> None:
    record, calls = victim.sink, []

    def sink(out: ReqOutput) -> None:
        calls.append(out)
        if len(calls) == 2:
            raise RuntimeError("injected sink fault")
        record(out)

    victim.sink = sink


PHASES = {  # phase -> (victim's extra params, words of its error message)
    "admission": ({}, "admitting it"),
    "slots": ({}, "taking its KV slots"),
    "sampling": ({"repetition_penalty": 1.1}, "while sampling"),
    "finishing": ({}, "finishing its token"),
    "emit": ({}, "delivering its output"),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_fault_in_one_requests_work_fails_it_alone(runner, solo, monkeypatch,
                                                     phase: str) -> None:
    run = Run(runner)
    extra, words = PHASES[phase]
    victim = run.submit(PROMPTS[0], **extra)
    others = [run.submit(p, **sp) for p, sp in OTHERS]
    if phase == "admission":
        _slots_fault(run, victim, lambda r: r.row is not None and not r.output_ids)
    elif phase == "slots":
        _slots_fault(run, victim, lambda r: len(r.output_ids) >= 2)
    elif phase == "sampling":
        _sampling_fault(monkeypatch, victim)
    elif phase == "finishing":
        victim.detokenizer = FaultyDetok(victim.detokenizer)
    else:
        _emit_fault(run, victim)
    run.drain()
    assert_failed(run, victim, words)
    assert len(run.tokens(victim)) < STEPS
    assert_others_and_later_fine(run, others, solo)


def _forward_fault(monkeypatch, runner: Any, when) -> list[Any]:
    real, failed = runner.forward, []

    def forward(batch):
        if not failed and when(batch):
            failed.append(batch)
            raise RuntimeError("injected forward fault")
        return real(batch)

    monkeypatch.setattr(runner, "forward", forward)
    return failed


def test_a_failed_prefill_forward_fails_only_its_request(runner, solo, monkeypatch) -> None:
    """A long prompt arriving while others decode is prefilled in a forward of its own: when
    that forward raises, only the new request fails (it was admitted in that very step)."""
    run = Run(runner)
    others = [run.submit(p, **sp) for p, sp in OTHERS]
    run.sched.step()  # their prefill
    run.sched.step()  # a decode step
    late = run.submit(LONG)
    failed = _forward_fault(monkeypatch, runner, lambda b: sum(b.extend_lens_cpu) > 128)
    run.drain()
    assert failed and not failed[0].is_decode and len(failed[0].extend_lens_cpu) == 1
    assert_failed(run, late, "the model step")
    assert run.tokens(late) == []
    assert_others_and_later_fine(run, others, solo)


def test_a_failed_mixed_forward_fails_its_requests_once_and_the_server_goes_on(
        runner, solo, monkeypatch) -> None:
    """A small prompt rides with the running requests' decode: when that forward raises,
    each of them - the one admitted in that step included - fails once; the next ones run."""
    run = Run(runner)
    running = [run.submit(p, **sp) for p, sp in OTHERS[:2]]
    run.sched.step()
    run.sched.step()
    arrived = run.submit(PROMPTS[0])
    failed = _forward_fault(monkeypatch, runner, lambda b: not b.is_decode)
    run.drain()
    assert failed and len(failed[0].extend_lens_cpu) == 3
    for req in running + [arrived]:
        assert_failed(run, req, "the model step")
        assert sum(o.finished for o in run.outs[req.rid]) == 1
    run.assert_kv_returned()
    again = [run.submit(p, **sp) for p, sp in OTHERS]
    run.drain()
    assert_others_and_later_fine(run, again, solo)
