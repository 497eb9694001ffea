"""The speculative verify step against a stand-in model whose next token depends on the whole KV.

The stand-in writes each new token id into a one-number-per-slot "KV pool" (one layer, so the
verify step's KV moves copy token ids) and predicts from the sequence it reads back through
``req_to_token`` and the batch's tree mask: a wrong slot, a KV move that misses, a freed page
that is reused too early, or a wrong mask changes the output. Greedy outputs must equal the
same function applied to the plain token list whatever the drafts; the sampled rule is checked
against the exact distribution of a soft stand-in.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

import pytest
import torch

from engine.api.speculative import Draft, Proposer
from engine.config import ServerConfig
from engine.runtime.batch import Batch, ForwardMode
from engine.runtime.request import Req, ReqOutput
from engine.runtime.sampling import SamplingParams
from engine.runtime.scheduler import Scheduler
from engine.runtime.speculative import SpecDecoder, ancestor_mask

VOCAB = 40


def next_token(seq: Sequence[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(seq)) * 31 + len(seq)) % VOCAB


def expected(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(seq))
        seq.append(out[-1])
    return out


class Pool:
    """One "layer" whose K is the token id written at each slot."""

    def __init__(self, num_slots: int, page_size: int) -> None:
        self.num_slots, self.page_size, self.num_layers = num_slots, page_size, 1
        self.device = torch.device("cpu")
        self.store = torch.full((num_slots,), -1, dtype=torch.long)
        self.k, self.v = [self.store], [torch.zeros(num_slots)]


class StandIn:
    """``forward(batch)``: logits from each token's visible sequence (prefix + tree path)."""

    def __init__(self, num_slots: int, page_size: int, rows: int = 16, ctx: int = 256,
                 soft: bool = False) -> None:
        self.device = torch.device("cpu")
        self.pool = Pool(num_slots, page_size)
        self.req_to_token = torch.zeros(rows, ctx, dtype=torch.long)
        self.soft = soft
        self.verify_batches: list[Batch] = []

    def logits_for(self, seq: list[int]) -> torch.Tensor:
        row = torch.zeros(VOCAB)
        if self.soft:  # a fixed, context-dependent distribution over a few tokens
            rng = random.Random(hash(tuple(seq[-2:])))
            for t in range(VOCAB):
                row[t] = rng.uniform(-2.0, 2.0) if t < 6 else -30.0
        else:
            row[next_token(seq)] = 10.0
        return row

    def verify_graph_width(self, batch_size: int, longest: int) -> int:
        """As a runner with verify graphs of width ``pad`` (0: none): rows come padded."""
        assert longest <= self.pad or not self.pad
        return self.pad

    pad = 0

    def forward(self, batch: Batch) -> torch.Tensor:
        real = torch.zeros(batch.num_tokens, dtype=torch.bool)
        real[batch.logits_indices if batch.mode is ForwardMode.VERIFY else slice(None)] = True
        assert (batch.out_cache_loc[real] > 0).all(), "slot 0 is reserved"
        assert (batch.out_cache_loc[~real] == 0).all(), "padding nodes write slot 0"
        if batch.mode is ForwardMode.VERIFY:
            self.verify_batches.append(batch)
            if self.pad and set(batch.extend_lens_cpu) != {self.pad}:  # only near the end
                assert max(batch.prefix_lens_cpu) + self.pad > self.req_to_token.shape[1]
        self.pool.store[batch.out_cache_loc] = batch.input_ids
        out = []
        starts = torch.cumsum(batch.extend_lens, 0) - batch.extend_lens
        for i in range(batch.batch_size):
            row, pre, n = (int(batch.req_pool_indices[i]), batch.prefix_lens_cpu[i],
                           batch.extend_lens_cpu[i])
            first = int(starts[i])
            n_real = int(real[first:first + n].sum())
            assert real[first:first + n_real].all(), "padding follows the real nodes"
            slots = self.req_to_token[row, :pre + n_real]
            prefix = self.pool.store[slots[:pre]].tolist()
            new = batch.input_ids[first:first + n].tolist()
            assert self.pool.store[slots[pre:]].tolist() == new[:n_real], \
                "new tokens at their slots"
            for j in range(n):
                if batch.tree_mask is not None:
                    seen = [new[k] for k in range(n) if batch.tree_mask[i, j, k]]
                    if j < n_real:
                        assert not batch.tree_mask[i, j, n_real:].any(), "a real node sees padding"
                else:
                    seen = new[:j + 1]
                out.append(self.logits_for(prefix + seen))
        return torch.stack(out)[batch.logits_indices]


class Oracle(Proposer):
    """Drafts from the stand-in's own rule: ``good`` right tokens, then wrong ones; with
    ``tree`` a wrong sibling comes before every right node."""

    def __init__(self, width: int, good: int, tree: bool = False) -> None:
        self.num_draft_tokens, self.good, self.drafts_trees = width, good, tree
        self.released: list[Any] = []
        self.verified: list[int] = []

    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        drafts = []
        for req in requests:
            seq = req.origin_input_ids + req.output_ids
            tokens, parents, parent = [], [], -1
            for d in range(self.num_draft_tokens):
                right = next_token(seq)
                tok = right if d < self.good else (right + 1) % VOCAB
                if self.drafts_trees:
                    tokens.append((right + 7) % VOCAB)
                    parents.append(parent)
                tokens.append(tok)
                parents.append(parent)
                parent = len(tokens) - 1
                seq = seq + [tok]
            drafts.append(Draft(tokens, parents))
        return drafts

    def on_verified(self, request: Any, accepted: int) -> None:
        self.verified.append(accepted)

    def release(self, request: Any) -> None:
        self.released.append(request)


class Detok:
    def add(self, t: int) -> str:
        return chr(ord("a") + t % 26)

    def finish(self) -> str:
        return ""


def make_sched(proposer: Proposer, num_slots: int = 512, page_size: int = 1, rows: int = 16,
               soft: bool = False, pad: int = 0, **cfg: Any) -> Scheduler:
    runner = StandIn(num_slots, page_size, rows, soft=soft)
    runner.pad = pad
    return Scheduler(ServerConfig(page_size=page_size, **cfg), runner,
                     speculative=SpecDecoder(proposer, runner))


def make_req(prompt: list[int], outs: dict[str, list[ReqOutput]], max_new: int = 12,
             rid: str | None = None, **sp: Any) -> Req:
    rid = rid or f"r{len(outs)}"
    outs[rid] = []
    params = SamplingParams(**{"temperature": 0.0, "max_new_tokens": max_new, **sp}).validate()
    gen = None
    if params.seed is not None:
        gen = torch.Generator().manual_seed(params.seed)
    return Req(rid=rid, origin_input_ids=prompt, sampling_params=params,
               sink=outs[rid].append, detokenizer=Detok(), max_new_tokens=max_new,
               stop_ids=frozenset(params.stop_token_ids), generator=gen)


def run(sched: Scheduler, reqs: list[Req], outs: dict[str, list[ReqOutput]]) -> dict[str, Any]:
    sched.submit(reqs)
    for _ in range(10_000):
        if not sched.step():
            break
    result = {}
    for req in reqs:
        chunks = outs[req.rid]
        assert chunks and chunks[-1].finished, f"{req.rid} did not finish"
        result[req.rid] = ([t for c in chunks for t in c.token_ids], chunks[-1])
    return result


def prompts(k: int, base: int = 10) -> list[list[int]]:
    return [[(base * i + j) % VOCAB + 1 for j in range(5 + 3 * i)] for i in range(k)]


def assert_no_leak(sched: Scheduler) -> None:
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens
    assert sched.rows.num_free == sched.rows.num_rows


# ---------------------------------------------------------------------- greedy, exact


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("good,tree", [(0, False), (2, False), (5, False), (2, True),
                                        (5, True)])
@pytest.mark.parametrize("pad", [0, 5], ids=["ragged", "padded"])
def test_greedy_output_is_the_targets_whatever_the_drafts(page_size, good, tree, pad):
    """``padded``: rows padded to the width, as for a captured verify forward."""
    proposer = Oracle(width=5, good=good, tree=tree)
    sched = make_sched(proposer, page_size=page_size, pad=pad)
    outs: dict[str, list[ReqOutput]] = {}
    reqs = [make_req(p, outs, max_new=13) for p in prompts(6)]
    got = run(sched, reqs, outs)
    for req, p in zip(reqs, prompts(6)):
        assert got[req.rid][0] == expected(p, 13)
    # `good` right tokens in 4 nodes (2 per level in a tree): that many accepted per verify
    per_step = min(good, 2 if tree else 4)
    assert proposer.verified and max(proposer.verified) == per_step
    assert sched.spec.stats.accepted_tokens == sum(proposer.verified)
    if tree or pad:
        assert any(b.tree_mask is not None for b in sched.runner.verify_batches)
    if pad:
        assert all(set(b.extend_lens_cpu) == {pad} for b in sched.runner.verify_batches)
    assert_no_leak(sched)
    assert {id(r) for r in proposer.released} >= {id(r) for r in reqs}


def test_each_request_reports_its_verify_count_and_accepted_tokens():
    proposer = Oracle(width=4, good=3)
    sched = make_sched(proposer)
    outs: dict[str, list[ReqOutput]] = {}
    req = make_req([3, 4, 5], outs, max_new=13)
    last = run(sched, [req], outs)[req.rid][1]
    # 1 token from the prefill, then 4 per verify: 3 verifies of 4 tokens
    assert last.spec_verify_ct == 3 and last.spec_accepted_tokens == 9
    assert last.completion_tokens == 13
    assert sched.stats().spec.accept_length == pytest.approx(4.0)


def test_a_request_ending_inside_a_verify_step_keeps_its_last_tokens_state():
    # the verify step's 4 tokens are one output: the last token's finish, counts and times
    proposer = Oracle(width=4, good=3)
    sched = make_sched(proposer)
    outs: dict[str, list[ReqOutput]] = {}
    req = make_req([3, 4, 5], outs, max_new=13)
    run(sched, [req], outs)
    last = outs[req.rid][-1]
    assert last.finished and len(last.token_ids) == 4
    times = last.time_stats
    assert times is not None
    assert times["arrival"] <= times["scheduled"] <= times["first_token"]


def test_requests_with_and_without_drafts_share_a_verify_batch():
    class Some(Oracle):
        def propose(self, requests):
            drafts = super().propose(requests)
            return [d if i % 2 == 0 else Draft() for i, d in enumerate(drafts)]

    sched = make_sched(Some(width=4, good=3), rows=8)
    outs: dict[str, list[ReqOutput]] = {}
    ps = prompts(4)
    reqs = [make_req(p, outs, max_new=10) for p in ps]
    got = run(sched, reqs, outs)
    assert all(got[r.rid][0] == expected(p, 10) for r, p in zip(reqs, ps))
    assert any(1 in b.extend_lens_cpu and max(b.extend_lens_cpu) > 1
               for b in sched.runner.verify_batches)
    assert_no_leak(sched)


def test_no_draft_at_all_runs_a_plain_decode():
    class Never(Oracle):
        def propose(self, requests):
            return [Draft() for _ in requests]

    sched = make_sched(Never(width=4, good=3))
    outs: dict[str, list[ReqOutput]] = {}
    req = make_req([1, 2, 3], outs, max_new=6)
    assert run(sched, [req], outs)[req.rid][0] == expected([1, 2, 3], 6)
    assert sched.runner.verify_batches == []


def test_drafts_stop_at_max_new_tokens_and_stop_tokens():
    sched = make_sched(Oracle(width=8, good=7))
    outs: dict[str, list[ReqOutput]] = {}
    want = expected([9, 9, 9], 20)
    stop = want[6]
    a = make_req([9, 9, 9], outs, max_new=5)
    b = make_req([9, 9, 9], outs, max_new=20, stop_token_ids=[stop])
    got = run(sched, [a, b], outs)
    assert got[a.rid][0] == want[:5] and got[a.rid][1].finish_reason["type"] == "length"
    first = want.index(stop)
    assert got[b.rid][0] == want[:first + 1]
    assert got[b.rid][1].finish_reason == {"type": "stop", "matched": stop}
    assert_no_leak(sched)


@pytest.mark.parametrize("pad", [0, 8], ids=["ragged", "padded"])
def test_overflowing_the_context_while_drafting_ends_with_length(pad):
    proposer = Oracle(width=8, good=7)
    runner = StandIn(512, 1, ctx=24)
    runner.pad = pad
    sched = Scheduler(ServerConfig(), runner, speculative=SpecDecoder(proposer, runner))
    outs: dict[str, list[ReqOutput]] = {}
    req = make_req(list(range(1, 11)), outs, max_new=100)
    tokens, last = run(sched, [req], outs)[req.rid]
    assert last.finish_reason["type"] == "length"
    assert len(tokens) + 10 == 24 and tokens == expected(list(range(1, 11)), 14)
    assert_no_leak(sched)


@pytest.mark.parametrize("pad", [0, 6], ids=["ragged", "padded"])
def test_memory_pressure_drops_drafts_and_retracts_without_leaks(pad):
    sched = make_sched(Oracle(width=6, good=5), num_slots=96, page_size=4, rows=8, pad=pad)
    outs: dict[str, list[ReqOutput]] = {}
    ps = prompts(6)
    reqs = [make_req(p, outs, max_new=14) for p in ps]
    got = run(sched, reqs, outs)
    assert all(got[r.rid][0] == expected(p, 14) for r, p in zip(reqs, ps))
    assert_no_leak(sched)


# ---------------------------------------------------------------------- sampled, lossless


def _exact(runner: StandIn, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """Exact probabilities of the first three generated tokens (temperature 1)."""
    out = {}
    p0 = torch.softmax(runner.logits_for(prompt), -1)
    for a in range(6):
        p1 = torch.softmax(runner.logits_for(prompt + [a]), -1)
        for b in range(6):
            p2 = torch.softmax(runner.logits_for(prompt + [a, b]), -1)
            for c in range(6):
                out[(a, b, c)] = float(p0[a] * p1[b] * p2[c])
    return out


PROMPT = [5, 1, 2, 4]


def _sample(proposer: Proposer | None, n: int) -> tuple[list[tuple[int, ...]], Any]:
    runner = StandIn(4096, 1, rows=64, soft=True)
    spec = SpecDecoder(proposer, runner) if proposer is not None else None
    sched = Scheduler(ServerConfig(max_running_requests=64), runner, speculative=spec)
    outs: dict[str, list[ReqOutput]] = {}
    reqs = [make_req(PROMPT, outs, max_new=3, temperature=1.0, seed=seed) for seed in range(n)]
    got = run(sched, reqs, outs)
    return [tuple(got[r.rid][0]) for r in reqs], sched


class SoftDraft(Proposer):
    """A fixed draft over the likely tokens: a chain, or a two-level tree."""

    def __init__(self, chain: bool) -> None:
        self.num_draft_tokens = 5
        self.drafts_trees = not chain
        self.chain = chain

    def propose(self, requests):
        if self.chain:
            return [Draft.chain([0, 2, 1]) for _ in requests]
        return [Draft([0, 1, 2, 2], [-1, -1, 0, 1]) for _ in requests]


@pytest.mark.parametrize("chain", [True, False])
def test_sampled_verify_draws_from_the_targets_distribution(chain):
    n = 3000
    seqs, sched = _sample(SoftDraft(chain), n)
    assert sched.spec.stats.accepted_tokens > n // 10, "drafts were accepted"
    exact = _exact(StandIn(8, 1, soft=True), PROMPT)
    counts: dict[tuple[int, ...], int] = {}
    for s in seqs:
        counts[s] = counts.get(s, 0) + 1
    stat, rest_obs, rest_exp, cells = 0.0, 0, 0.0, 0
    for key, p in exact.items():
        if p * n >= 5:
            stat += (counts.get(key, 0) - p * n) ** 2 / (p * n)
            cells += 1
        else:
            rest_obs += counts.get(key, 0)
            rest_exp += p * n
    stat += (rest_obs - rest_exp) ** 2 / max(rest_exp, 1e-9)
    dof = cells  # cells + the rest cell, minus one
    # the 0.999 quantile of chi-square (Wilson-Hilferty); fixed seeds: reproducible
    z = 3.09
    limit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert stat < limit, (stat, dof)
    # one draw per emitted token from the request's generator: the same seeds give the same
    # sequences as decoding without drafts
    plain, _ = _sample(None, 300)
    assert seqs[:300] == plain


# ---------------------------------------------------------------------- pieces


def test_draft_truncation_keeps_whole_branches():
    d = Draft([10, 11, 12, 13, 14], [-1, 0, -1, 1, 2])
    assert d.depths() == [1, 2, 1, 3, 2]
    t = d.truncated(max_nodes=4, max_depth=2)
    assert t.token_ids == [10, 11, 12, 14] and t.parents == [-1, 0, -1, 2]
    assert Draft.chain([1, 2, 3]).is_chain and not d.is_chain


def test_ancestor_mask_of_a_tree():
    m = ancestor_mask(Draft([10, 11, 12], [-1, -1, 0]), 5)
    assert m[0].tolist() == [True, False, False, False, False]
    assert m[1].tolist() == [True, True, False, False, False]
    assert m[2].tolist() == [True, False, True, False, False]
    assert m[3].tolist() == [True, True, False, True, False]
    assert m[4].tolist() == [True, False, False, False, True]  # padding sees the root


def test_a_greedy_tree_is_drawn_in_one_sampler_call_per_verify():
    """Greedy rows with nothing that looks at earlier tokens: every node's token comes from one
    sampler call, whatever the depth reached; a penalised row walks depth by depth."""
    for penalty, per_verify in ((1.0, 1), (1.3, None)):
        sched = make_sched(Oracle(width=5, good=3, tree=True))
        calls: list[int] = []
        inner = sched.sampler
        sched.sampler = lambda rows, reqs, *a: calls.append(len(reqs)) or inner(rows, reqs, *a)
        outs: dict[str, list[ReqOutput]] = {}
        req = make_req([3, 4, 5], outs, max_new=13, repetition_penalty=penalty)
        run(sched, [req], outs)
        verifies = sched.spec.stats.verify_forwards
        if per_verify:  # the prefill's call, then one per verify
            assert len(calls) == 1 + verifies and min(calls[1:]) > 1
        else:  # one call per depth reached, one row each
            assert len(calls) > 1 + verifies and set(calls) == {1}


def test_a_verify_batch_is_padded_to_the_narrowest_captured_width_that_holds_it():
    from types import SimpleNamespace

    from engine.runtime.model_runner import ModelRunner

    runner = ModelRunner.__new__(ModelRunner)
    runner.verify_graphs = [SimpleNamespace(width=2, max_batch=64),
                            SimpleNamespace(width=4, max_batch=64),
                            SimpleNamespace(width=12, max_batch=16)]
    assert runner.verify_graph_width(8, 1) == 2 and runner.verify_graph_width(8, 3) == 4
    assert runner.verify_graph_width(8, 5) == 12
    assert runner.verify_graph_width(32, 5) == 0  # no 12-wide graph for 32 requests
    assert runner.verify_graph_width(1, 13) == 0  # wider than every graph
    runner.verify_graphs = []
    assert runner.verify_graph_width(1, 2) == 0
