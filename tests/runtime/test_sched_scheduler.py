"""Scheduler bookkeeping against a stand-in model whose next token depends on the whole KV.

The stand-in writes each new token id into a one-number-per-slot "KV pool" and predicts the
next token from the sequence it reads back through ``req_to_token``: any slot mix-up (a wrong
prefix from the radix cache, a page overwritten after eviction or retraction, a chunk at the
wrong position) changes the output. Tests compare against the same function applied to the
plain token list. (The real model's end-to-end behaviour is tested in tests/server/.)
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import pytest
import torch

from engine.config import ServerConfig
from engine.runtime.batch import Batch
from engine.assembly import Assembly
from engine.plugins.registry import Registry
from engine.runtime import model_runner
from engine.runtime.frontend import start_runtime
from engine.runtime.request import ChannelSink, Req, ReqOutput, emit
from engine.runtime.sampling import SamplingParams
from engine.runtime.scheduler import QueueFull, Scheduler

VOCAB = 40


def next_token(seq: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(seq)) * 31 + len(seq)) % VOCAB


class Pool:
    def __init__(self, num_slots: int, page_size: int) -> None:
        self.num_slots, self.page_size = num_slots, page_size
        self.store = torch.full((num_slots,), -1, dtype=torch.long)


class StandInRunner:
    """Implements ``forward(batch) -> logits`` from the slots only."""

    def __init__(self, num_slots: int, page_size: int, rows: int = 8, ctx: int = 256) -> None:
        self.device = torch.device("cpu")
        self.pool = Pool(num_slots, page_size)
        self.req_to_token = torch.zeros(rows, ctx, dtype=torch.long)
        self.batches: list[Batch] = []

    def forward(self, batch: Batch) -> torch.Tensor:
        self.batches.append(batch)
        assert (batch.out_cache_loc > 0).all(), "slot 0 is reserved"
        self.pool.store[batch.out_cache_loc] = batch.input_ids
        ends = torch.cumsum(batch.extend_lens, 0) - 1
        logits = torch.zeros(len(batch.logits_indices), VOCAB)
        for j, tok_idx in enumerate(batch.logits_indices.tolist()):
            i = int((ends < tok_idx).sum())
            row, n = int(batch.req_pool_indices[i]), batch.seq_lens_cpu[i]
            seq = self.pool.store[self.req_to_token[row, :n]].tolist()
            logits[j, next_token(seq)] = 10.0
        return logits


class Detok:
    def add(self, t: int) -> str:
        return chr(ord("a") + t % 26)

    def finish(self) -> str:
        return ""


def make_sched(num_slots: int = 512, page_size: int = 1, rows: int = 8,
               **cfg: Any) -> Scheduler:
    return Scheduler(ServerConfig(page_size=page_size, **cfg), StandInRunner(num_slots,
                                                                             page_size, rows))


_ids = itertools.count()


@pytest.fixture(autouse=True, params=["sync", "overlap"])
def schedule_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with tokens read back at once and with the overlap scheduler (each
    step's tokens read back after the next step is launched), forced on CPU."""
    monkeypatch.setenv("ENGINE_OVERLAP_SCHEDULE", "1" if request.param == "overlap" else "0")
    return request.param


def make_req(prompt: list[int], outs: dict[str, list[ReqOutput]], max_new: int = 8,
             rid: str | None = None, **sp: Any) -> Req:
    rid = rid or f"r{next(_ids)}"
    outs[rid] = []
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, **sp).validate()
    return Req(rid=rid, origin_input_ids=prompt, sampling_params=params,
               sink=outs[rid].append, detokenizer=Detok(), max_new_tokens=max_new,
               stop_ids=frozenset(params.stop_token_ids))


def expected(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(seq))
        seq.append(out[-1])
    return out


def drain(sched: Scheduler) -> None:
    for _ in range(10_000):
        if not sched.step():
            return


def run(sched: Scheduler, reqs: list[Req], outs: dict[str, list[ReqOutput]], *,
        submit: bool = True) -> dict[str, Any]:
    if submit:
        sched.submit(reqs)
    drain(sched)
    result = {}
    for req in reqs:
        chunks = outs[req.rid]
        assert chunks and chunks[-1].finished, f"{req.rid} did not finish"
        result[req.rid] = ([t for c in chunks for t in c.token_ids],
                           "".join(c.text for c in chunks), chunks[-1])
    return result


def prompts(k: int, base: int = 10) -> list[list[int]]:
    return [[(base * i + j) % VOCAB + 1 for j in range(5 + 3 * i)] for i in range(k)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_concurrent_requests_match_the_sequential_reference(page_size: int) -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(page_size=page_size)
    ps = prompts(6)
    res = run(sched, [make_req(p, outs) for p in ps], outs)
    for p, (toks, _, last) in zip(ps, res.values()):
        assert toks == expected(p, 8)
        assert last.finish_reason == {"type": "length"}
    assert sched.allocator.free_tokens + sched.cache.total_size == \
        sched.allocator.capacity_tokens, "every slot is free or cached after the run"
    assert sched.cache.protected_size == 0


@pytest.mark.parametrize("page_size", [1, 2])
def test_shared_prefix_hits_the_cache_with_the_same_output(page_size: int) -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(page_size=page_size)
    shared = list(range(1, 21))
    first = run(sched, [make_req(shared + [3, 4], outs)], outs)
    second = run(sched, [make_req(shared + [5, 6, 7], outs)], outs)
    (t1, _, o1), = first.values()
    (t2, _, o2), = second.values()
    assert o1.cached_tokens == 0
    assert o2.cached_tokens == 20
    assert t2 == expected(shared + [5, 6, 7], 8)
    assert sched.runner.batches[-8].extend_lens_cpu == [3]  # only the new tokens prefilled


def test_chunked_prefill_cuts_long_prompts_and_keeps_the_output() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(chunked_prefill_size=7)
    long = [(7 * j) % VOCAB + 1 for j in range(30)]
    res = run(sched, [make_req(long, outs)], outs)
    (toks, _, _), = res.values()
    assert toks == expected(long, 8)
    extend = [b.extend_lens_cpu for b in sched.runner.batches if not b.is_decode]
    assert extend == [[7], [7], [7], [7], [2]]


def test_memory_pressure_retracts_and_still_gives_the_same_outputs() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(num_slots=64, page_size=2)  # 62 usable slots for 6 x ~25 tokens
    ps = prompts(6)
    res = run(sched, [make_req(p, outs, max_new=12) for p in ps], outs)
    for p, (toks, _, _) in zip(ps, res.values()):
        assert toks == expected(p, 12)
    assert sched.num_retractions > 0
    assert sched.cache.protected_size == 0


def test_a_lone_request_that_outgrows_the_cache_ends_with_length() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(num_slots=17, page_size=1)  # 16 usable slots
    res = run(sched, [make_req(list(range(1, 11)), outs, max_new=50)], outs)
    (toks, _, last), = res.values()
    assert last.finish_reason["type"] == "length"
    assert toks == expected(list(range(1, 11)), len(toks)) and len(toks) == 7


def test_stop_token_and_stop_string_across_tokens() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    p = [1, 2, 3]
    ref = expected(p, 8)
    text = "".join(chr(ord("a") + t % 26) for t in ref)
    sched = make_sched()
    by_id = make_req(p, outs, stop_token_ids=[ref[3]])
    stop = text[4:6]  # spans two tokens
    by_str = make_req(p, outs, stop=[stop])
    res = run(sched, [by_id, by_str], outs)
    toks, txt, last = res[by_id.rid]
    assert toks == ref[:4] and txt == text[:3]  # the stop id counts, its text is not sent
    assert last.finish_reason == {"type": "stop", "matched": ref[3]}
    toks, txt, last = res[by_str.rid]
    assert txt == text[:text.index(stop)] and last.finish_reason["matched"] == stop
    assert all(stop[0] not in c.text or c.finished for c in outs[by_str.rid][:-1])


def test_min_new_tokens_defers_a_stop_id() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    p = [1, 2, 3]
    ref = expected(p, 8)
    req = make_req(p, outs, stop_token_ids=[ref[0]], min_new_tokens=3)
    (toks, _, _), = run(make_sched(), [req], outs).values()
    assert len(toks) >= 3


def test_abort_ends_waiting_and_running_requests() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(rows=1)
    a, b = make_req([1, 2, 3], outs, max_new=50), make_req([4, 5], outs, max_new=50)
    sched.submit([a, b])
    sched.step()
    sched.step()
    sched.abort([a])
    sched.abort([b])
    sched.step()
    for r in (a, b):
        assert outs[r.rid][-1].finish_reason["type"] == "abort"
    assert not sched.has_work
    assert sched.allocator.free_tokens + sched.cache.total_size == \
        sched.allocator.capacity_tokens


def test_queue_limit_rejects_beyond_max_queued_requests() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(max_queued_requests=2)
    sched.submit([make_req([1], outs), make_req([2], outs)])
    with pytest.raises(QueueFull, match="max-queued-requests"):
        sched.submit([make_req([3], outs)])


def test_lpm_runs_the_longest_cached_prefix_first(schedule_mode: str) -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(rows=1, schedule_policy="lpm")
    shared = list(range(1, 16))
    run(sched, [make_req(shared + [1], outs, max_new=1)], outs)
    cold, warm = make_req([9, 9, 9, 9], outs, max_new=1), make_req(shared + [2], outs,
                                                                   max_new=1)
    sched.submit([cold, warm])
    sched.step()
    if schedule_mode == "overlap":  # its token is read back by the next step
        assert not outs[warm.rid]
        sched.step()
    assert outs[warm.rid] and not outs[cold.rid]


def test_zero_max_new_tokens_prefills_and_generates_nothing() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched()
    (toks, txt, last), = run(sched, [make_req([1, 2, 3], outs, max_new=0)], outs).values()
    assert toks == [] and txt == "" and last.finish_reason == {"type": "length"}
    assert last.completion_tokens == 0 and last.prompt_tokens == 3


def test_a_small_prefill_shares_the_forward_of_the_running_requests() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched()
    first = make_req([1, 2, 3], outs, max_new=8)
    sched.submit([first])
    sched.step()  # prefill of the first request
    sched.step()  # its first decode
    late = [make_req(p, outs, max_new=8) for p in prompts(3)]
    res = run(sched, late, outs)
    for p, (toks, _, _) in zip(prompts(3), res.values()):
        assert toks == expected(p, 8)
    assert [t for o in outs[first.rid] for t in o.token_ids] == expected([1, 2, 3], 8)
    mixed = sched.runner.batches[2]
    assert not mixed.is_decode and mixed.extend_lens_cpu == [5, 8, 11, 1]
    assert all(b.is_decode for b in sched.runner.batches[3:]), "no separate prefill step"


def test_enable_mixed_chunk_is_off_for_a_backend_that_pads_extend_rows() -> None:
    class Padding:
        pads_extend = True

    runner = StandInRunner(512, 1)
    runner.prefill_backend = Padding()
    sched = Scheduler(ServerConfig(page_size=1, enable_mixed_chunk=True), runner)
    assert not sched._mix_any
    assert make_sched(enable_mixed_chunk=True)._mix_any


@pytest.mark.parametrize("mixed,kinds", [
    # the chunk of 150 runs alone between decode steps; the last 50 mix with a decode
    (False, ["e3", "d", "e150", "e51", "d"]),
    # --enable-mixed-chunk: each chunk rides with the running request's next token
    (True, ["e3", "e151", "e51", "d"]),
])
def test_a_large_prefill_alternates_with_decode_steps_or_mixes(mixed, kinds) -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(chunked_prefill_size=150, enable_mixed_chunk=mixed)
    first = make_req([1, 2, 3], outs, max_new=8)
    sched.submit([first])
    sched.step()
    long = [(3 * j) % VOCAB + 1 for j in range(200)]  # above MIXED_PREFILL_TOKENS
    res = run(sched, [make_req(long, outs, max_new=4)], outs)
    (toks, _, _), = res.values()
    assert toks == expected(long, 4)
    assert [t for o in outs[first.rid] for t in o.token_ids] == expected([1, 2, 3], 8)
    got = ["d" if b.is_decode else "e" + str(sum(b.extend_lens_cpu))
           for b in sched.runner.batches]
    assert got[:len(kinds)] == kinds


class RecordingChannel:
    """A channel that delivers at once and records each delivery's request ids."""

    def __init__(self) -> None:
        self.deliveries: list[list[str]] = []

    def deliver(self, items: list[tuple[ChannelSink, ReqOutput]]) -> None:
        self.deliveries.append([out.rid for _, out in items])
        for sink, out in items:
            sink.receive(out)


def test_channel_sinks_get_one_delivery_per_step_with_every_output() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    channel = RecordingChannel()
    sched = make_sched()
    ps = prompts(4)
    reqs = [make_req(p, outs) for p in ps]
    for req in reqs:
        req.sink = ChannelSink(channel, outs[req.rid].append)
    res = run(sched, reqs, outs)
    for p, (toks, _, _) in zip(ps, res.values()):
        assert toks == expected(p, 8)
    assert len(channel.deliveries) == len(sched.runner.batches), "one delivery per forward"
    decode = [d for d, b in zip(channel.deliveries, sched.runner.batches) if b.is_decode]
    assert decode and all(sorted(d) == sorted(r.rid for r in reqs) for d in decode)


def test_emit_calls_plain_sinks_and_groups_each_channel_in_order() -> None:
    got: list[str] = []
    a, b = RecordingChannel(), RecordingChannel()
    items = [(ChannelSink(a, lambda o: got.append("a" + o.rid)), ReqOutput(rid="1")),
             (lambda o: got.append("p" + o.rid), ReqOutput(rid="2")),
             (ChannelSink(b, lambda o: got.append("b" + o.rid)), ReqOutput(rid="3")),
             (ChannelSink(a, lambda o: got.append("a" + o.rid)), ReqOutput(rid="4"))]
    emit(items)
    assert a.deliveries == [["1", "4"]] and b.deliveries == [["3"]]
    assert got == ["p2", "a1", "a4", "b3"]


def test_batch_vectors_match_the_requests() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(chunked_prefill_size=6)
    a, b = make_req([1, 2, 3, 4], outs, max_new=2), make_req([5, 6, 7, 8, 9], outs, max_new=2)
    run(sched, [a, b], outs)
    first, second = [bt for bt in sched.runner.batches if not bt.is_decode][:2]
    assert first.extend_lens_cpu == [4, 2] and first.prefix_lens_cpu == [0, 0]
    assert first.input_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert first.positions.tolist() == [0, 1, 2, 3, 0, 1]
    assert first.logits_indices.tolist() == [3]  # b's prompt is not complete yet
    # b's last chunk and a's next token share the forward (a mixed step)
    a_first = expected([1, 2, 3, 4], 1)[0]
    assert second.extend_lens_cpu == [3, 1] and second.prefix_lens_cpu == [2, 4]
    assert second.positions.tolist() == [2, 3, 4, 4]
    assert second.input_ids.tolist() == [7, 8, 9, a_first]
    assert second.logits_indices.tolist() == [2, 3]
    for batch in sched.runner.batches:
        assert batch.seq_lens.tolist() == batch.seq_lens_cpu == [
            p + e for p, e in zip(batch.prefix_lens_cpu, batch.extend_lens_cpu)]
        assert batch.prefix_lens.tolist() == batch.prefix_lens_cpu
        assert batch.extend_lens.tolist() == batch.extend_lens_cpu
        assert batch.out_cache_loc.shape == batch.input_ids.shape == batch.positions.shape
    decode = [bt for bt in sched.runner.batches if bt.is_decode][0]
    assert decode.positions.tolist() == decode.prefix_lens_cpu


def test_step_timing_logs_a_summary_when_enabled(monkeypatch, caplog) -> None:
    monkeypatch.setenv("ENGINE_STEP_TIMING", "3")
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched()
    with caplog.at_level(logging.INFO, logger="engine.scheduler"):
        run(sched, [make_req([1, 2, 3], outs, max_new=6)], outs)
    lines = [r.getMessage() for r in caplog.records if "step timing" in r.getMessage()]
    assert len(lines) == 2  # 6 steps, a summary every 3
    assert "forward=" in lines[0] and "decode1:3" in lines[1]


class ThreadRecordingRunner(StandInRunner):
    """A stand-in for ``ModelRunner(config, assembly)`` that records the threads it runs in."""

    threads: dict[str, int] = {}

    def __init__(self, config: ServerConfig, assembly: Any) -> None:
        super().__init__(512, 1)
        self.threads["load"] = threading.get_ident()
        self.tokenizer = type("Tok", (), {"eos_token_ids": (), "chat_template": None})()
        self.model_config = type("Cfg", (), {"vocab_size": VOCAB, "eos_token_ids": (),
                                             "model_path": ""})()

    def forward(self, batch: Batch) -> torch.Tensor:
        self.threads["forward"] = threading.get_ident()
        return super().forward(batch)


def test_start_runtime_loads_and_steps_in_one_thread(monkeypatch) -> None:
    monkeypatch.setattr(model_runner, "ModelRunner", ThreadRecordingRunner)
    config = ServerConfig(page_size=1)
    runtime = start_runtime(config, Assembly(config, Registry(records=[])))
    try:
        done = threading.Event()
        outs: dict[str, list[ReqOutput]] = {}
        req = make_req([1, 2, 3], outs, max_new=3)
        req.sink = lambda out: (outs[req.rid].append(out), out.finished and done.set())
        runtime.scheduler.submit([req])
        assert done.wait(10)
    finally:
        runtime.shutdown()
    threads = ThreadRecordingRunner.threads
    assert threads["load"] == threads["forward"] != threading.get_ident()
    assert [t for o in outs[req.rid] for t in o.token_ids] == expected([1, 2, 3], 3)


def test_start_runtime_raises_what_the_load_raised(monkeypatch) -> None:
    def broken(config: ServerConfig, assembly: Any) -> None:
        raise RuntimeError("no such model")

    monkeypatch.setattr(model_runner, "ModelRunner", broken)
    with pytest.raises(RuntimeError, match="no such model"):
        start_runtime(ServerConfig(), Assembly(ServerConfig(), Registry(records=[])))


def test_abort_ends_exactly_the_requests_named() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched()
    x = make_req([1, 2, 3], outs, max_new=20, rid="x")
    x1 = make_req([4, 5], outs, max_new=20, rid="x-1")  # another client's, extending "x"
    sched.submit([x, x1])
    sched.step()
    sched.abort([x])
    res = run(sched, [x1], outs, submit=False)
    assert outs["x"][-1].finish_reason == {"type": "abort", "message": "request aborted"}
    assert res["x-1"][0] == expected([4, 5], 20)


def fail_forward_once(sched: Scheduler, when) -> list[Batch]:
    real, failed = sched.runner.forward, []

    def forward(batch: Batch) -> torch.Tensor:
        if not failed and when(batch):
            failed.append(batch)
            raise RuntimeError("injected")
        return real(batch)

    sched.runner.forward = forward
    return failed


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_failed_forward_frees_its_requests_partial_pages(page_size: int) -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(page_size=page_size)
    reqs = [make_req(p, outs, max_new=10) for p in prompts(3)]
    sched.submit(reqs)
    failed = fail_forward_once(sched, lambda b: b.is_decode and b.seq_lens_cpu[0] == 9)
    drain(sched)
    assert failed
    for req in reqs:
        assert outs[req.rid][-1].finish_reason["message"].startswith(
            "internal error in the model step: RuntimeError: injected")
        assert sum(o.finished for o in outs[req.rid]) == 1
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens
    later = make_req([7, 8, 9], outs)
    (toks, _, _), = run(sched, [later], outs).values()
    assert toks == expected([7, 8, 9], 8)


def test_when_the_clean_up_fails_too_memory_starts_over_and_the_queue_goes_on() -> None:
    outs: dict[str, list[ReqOutput]] = {}
    sched = make_sched(rows=2)
    first = [make_req(p, outs, max_new=10) for p in prompts(2)]
    queued = make_req([3, 4, 5], outs, max_new=4)
    sched.submit(first + [queued])
    sched.step()
    fail_forward_once(sched, lambda b: b.is_decode)

    def broken(req: Req, slots: list[int]) -> None:
        raise RuntimeError("bookkeeping broken")

    sched._free_pending = broken  # type: ignore[method-assign]
    res = run(sched, [queued], outs, submit=False)
    for req in first:
        assert outs[req.rid][-1].finish_reason["type"] == "abort"
    assert res[queued.rid][0] == expected([3, 4, 5], 4)
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens
