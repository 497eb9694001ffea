"""Breakable prefill graphs (:class:`engine.runtime.cuda_graph.PrefillGraphs`) without a GPU:
the same breaks, static buffers and padding, run eagerly (``--debug-cuda-graph``), give the
eager forward's logits for ragged batches with and without cached prefixes, and padding tokens
write only the reserved slot 0. The captured graphs themselves: test_prefill_graphs_cuda.py."""

from __future__ import annotations

import pytest
import torch

from _default_model import EXACT, default_runner, greedy
from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.runtime.cuda_graph import (PREFILL_BUCKETS, PrefillGraphs, bucket_for,
                                       prefill_buckets)
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder


def test_prefill_buckets_pad_by_at_most_one_step_and_end_at_the_maximum() -> None:
    assert prefill_buckets(1024) == list(PREFILL_BUCKETS)
    assert prefill_buckets(1024)[:3] == [16, 32, 48]
    assert prefill_buckets(100) == [16, 32, 48, 64, 80, 96, 112]
    assert prefill_buckets(2000)[-1] == 2000 and prefill_buckets(2001)[-1] == 2016
    assert prefill_buckets(4096, [64, 5000, 8, 64]) == [8, 64]
    with pytest.raises(ConfigError, match="no token count within 1..1024"):
        prefill_buckets(1024, [2048, 4096])
    # past 256 tokens a forward is padded by at most an eighth
    pairs = [(a, b) for a, b in zip(PREFILL_BUCKETS, PREFILL_BUCKETS[1:]) if a >= 256]
    assert max((b - a) / a for a, b in pairs) <= 0.125


def test_without_padding_only_a_captured_size_replays() -> None:
    assert bucket_for([1, 2, 4, 8], 3) == 4 and bucket_for([1, 2, 4, 8], 9) == 0
    assert bucket_for([1, 2, 4, 8], 3, padding=False) == 0
    assert bucket_for([1, 2, 4, 8], 4, padding=False) == 4
    graphs = _graphs(default_runner())
    builder = BatchBuilder(default_runner().req_to_token, default_runner().pool.num_slots,
                           default_runner().page_size)
    row = builder.new_request()
    try:
        for n, padded, exact in ((20, 32, 0), (32, 32, 32), (65, 0, 0)):
            batch = builder.extend([(row, [5] * n)])
            graphs.padding = True
            assert graphs.size_for(batch) == padded
            graphs.padding = False
            assert graphs.size_for(batch) == exact
    finally:
        builder.free(row)
        default_runner().req_to_token.zero_()


def _graphs(runner: ModelRunner, max_tokens: int = 64) -> PrefillGraphs:
    def forward(batch, attn):
        return runner.model(batch.input_ids, batch.positions, batch, attn, batch.logits_indices)

    return PrefillGraphs(forward, runner.prefill_backend, runner.req_to_token, max_tokens,
                         capture=False)


def test_breaks_buffers_and_padding_give_the_eager_logits() -> None:
    runner = default_runner()
    graphs = _graphs(runner)
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    rows = [builder.new_request() for _ in range(3)]
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 40000, (n,), generator=gen).tolist()

    try:
        runner.forward(builder.extend([(rows[0], ids(21)), (rows[1], ids(9))]))  # prefixes
        for items in ([(rows[0], ids(13)), (rows[1], ids(1)), (rows[2], ids(30))],
                      [(rows[2], ids(48))], [(rows[0], ids(5))]):
            batch = builder.extend(items)
            size = graphs.size_for(batch)
            assert size == next(b for b in graphs.buckets if b >= batch.num_tokens)
            k0 = runner.pool.k[0].clone()
            eager = runner._forward(batch)  # writes this batch's K/V
            written = set(batch.out_cache_loc.tolist())
            runner.prefill_backend.prepare(batch)
            got = runner._logits(graphs.run(batch, size))
            torch.testing.assert_close(got, eager, atol=2e-4, rtol=2e-4)
            assert torch.equal(got.argmax(-1), eager.argmax(-1))
            changed = (runner.pool.k[0] != k0).flatten(1).any(1).nonzero().flatten().tolist()
            assert set(changed) <= written | {0}, "padding wrote beyond the reserved slot 0"
            if size > batch.num_tokens:
                assert graphs.input_ids[batch.num_tokens:size].eq(0).all()
                assert graphs.out_cache_loc[batch.num_tokens:size].eq(0).all()
    finally:
        for row in rows:
            builder.free(row)
        runner.req_to_token.zero_()


def test_a_runner_with_debug_graphs_decodes_the_default_runners_tokens() -> None:
    config = ServerConfig(device="cpu", dtype="float32", max_total_tokens=8192,
                          attention_backend="torch_native", max_running_requests=8,
                          plugin_options=EXACT, debug_cuda_graph=True,
                          cuda_graph_max_bs_prefill=40)
    runner = ModelRunner(config)
    assert runner.prefill_graphs is not None and runner.prefill_graphs.buckets[-1] == 48
    assert default_runner().prefill_graphs is None  # on CPU only when asked for
    prompts = [[1, 504, 3458, 314, 253, 2385, 30] * (k + 1) for k in range(3)]  # 7-21 tokens
    calls = []
    run = runner.prefill_graphs.run
    runner.prefill_graphs.run = lambda b, s: calls.append(s) or run(b, s)
    want, first = greedy(default_runner(), prompts, 6, chunks=2)
    got, got_first = greedy(runner, prompts, 6, chunks=2)
    assert calls == [32, 32]  # both chunks of the three prompts (21 and 21 tokens)
    assert got == want
    torch.testing.assert_close(got_first, first, atol=2e-4, rtol=2e-4)


def test_full_prefill_graphs_are_refused_with_what_is_built() -> None:
    runner = ModelRunner.__new__(ModelRunner)
    runner.config = ServerConfig(device="cpu", cuda_graph_backend_prefill="full")
    with pytest.raises(ConfigError, match="'breakable' replays everything but attention"):
        runner._make_prefill_graphs()
