"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step launches a few hundred small kernels; on a GPU the host cannot issue them as fast
as the device runs them, so each step is captured once per bucket and replayed. The runner copies
a step's inputs into static buffers (padded to the bucket: padded requests read one token of row
0 and write their K/V into the reserved padding slot 0), replays, and returns the first rows of
the static logits. A backend that keeps a host-written plan refreshes it before each replay
(``prepare_replay``). Only decode batches of backends that declare ``supports_cuda_graph`` use
it. The decode graphs end with the sampling kernel (:mod:`engine.runtime.sample_triton`) over
the logits, its parameters static buffers like the inputs (``batch.sample_args``; greedy where
a batch brings none): the step's tokens come out of the replay (``batch.drawn_ids``), and the
sampler uses them unless it changes a row's logits first.

Speculative verify forwards (:class:`VerifyGraphs`) are captured the same way for backends that
declare ``supports_verify_graph``: a bucket of requests times the verify width, every row padded
to that width by the verify step (padding nodes write the reserved slot 0 and no real node sees
them), the tree mask always given. Everything else runs eagerly.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch

from engine.runtime.attention import AttentionBackend
from engine.runtime.batch import Batch, ForwardMode

log = logging.getLogger("engine.runtime")

BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


#: verify graphs are captured for batch buckets up to this many tokens (bucket x width): past
#: it a verify forward is long enough for its launches not to matter
VERIFY_GRAPH_TOKENS = 1024
#: verify widths captured besides the proposer's own (those below it): a verify step is padded
#: to the smallest captured width that holds its longest row, not always to the full width
VERIFY_WIDTHS = (2, 4, 8)


def graph_buckets(max_batch: int, sizes: Sequence[int] | None = None) -> list[int]:
    """The decode batch sizes to capture: ``sizes`` (``--cuda-graph-bs-decode``) up to
    ``max_batch``, or :data:`BUCKETS` up to it and ``max_batch`` itself (when within them).
    Larger batches run eagerly."""
    if sizes:
        return sorted({b for b in sizes if 1 <= b <= max_batch}) or [1]
    buckets = [b for b in BUCKETS if b <= max_batch] or [1]
    if buckets[-1] < max_batch <= BUCKETS[-1]:
        buckets.append(max_batch)
    return buckets


def capture_graph(run: Callable[[], Any], pool: object) -> tuple[torch.cuda.CUDAGraph, Any]:
    """The CUDA graph of ``run()`` in memory ``pool`` (``None``: a pool of its own, the
    graph's ``pool()``), and what it returned (its output buffers). Two runs on a side stream
    first compile the kernels and settle the allocations."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


class DecodeGraphs:
    """Captured decode forwards for batch sizes up to ``max_batch`` (:func:`graph_buckets`);
    ``forward`` gives logits [B, vocab], and the graphs draw the batch's tokens from them too
    unless ``sample`` is False (a forward whose output is not logits: the attention kit's)."""

    def __init__(self, forward: Callable[[Batch], torch.Tensor], backend: AttentionBackend,
                 req_to_token: torch.Tensor, max_batch: int,
                 sizes: Sequence[int] | None = None, sample: bool = True) -> None:
        self.sample = sample
        self.buckets = graph_buckets(max_batch, sizes)
        self.max_batch = self.buckets[-1]
        dev = req_to_token.device
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=dev)
        self.ones = torch.ones(n, dtype=torch.int64, device=dev)
        self.rows = torch.arange(n, dtype=torch.int64, device=dev)
        #: the sampling kernel's parameters, one row each (all zeros: greedy)
        self.sample_args = torch.zeros(6, n, dtype=torch.int64, device=dev)
        self.req_to_token = req_to_token
        self.backend = backend
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.ids: dict[int, torch.Tensor] = {}
        #: the captured batches: their ``attn_metadata`` may hold device tensors the graphs read
        self.batches: dict[int, Batch] = {}
        self.pool = torch.cuda.graph_pool_handle()
        t0 = time.monotonic()
        for k, size in enumerate(reversed(self.buckets)):  # largest first: smaller graphs
            self._capture(size, forward, backend)             # reuse its memory
            if k == 0 or (k + 1) % 4 == 0:
                log.info("captured decode CUDA graph %d/%d (batch %d), %.1f s", k + 1,
                         len(self.buckets), size, time.monotonic() - t0)
        log.info("captured decode CUDA graphs for batch sizes %s in %.1f s", self.buckets,
                 time.monotonic() - t0)

    def _static_batch(self, size: int) -> Batch:
        return Batch(
            mode=ForwardMode.DECODE, input_ids=self.input_ids[:size],
            positions=self.positions[:size], out_cache_loc=self.out_cache_loc[:size],
            req_pool_indices=self.req_pool_indices[:size], seq_lens=self.seq_lens[:size],
            prefix_lens=self.positions[:size], extend_lens=self.ones[:size],
            req_to_token=self.req_to_token, seq_lens_cpu=[1] * size,
            prefix_lens_cpu=[0] * size, extend_lens_cpu=[1] * size,
            logits_indices=self.rows[:size])

    def _capture(self, size: int, forward: Callable[[Batch], torch.Tensor],
                 backend: AttentionBackend) -> None:
        from engine.runtime import sample_triton

        batch = self.batches[size] = self._static_batch(size)
        backend.prepare_graph(batch)
        args = [a[:size] for a in self.sample_args.unbind(0)]

        def step() -> tuple[torch.Tensor, torch.Tensor | None]:
            logits = forward(batch)
            return logits, sample_triton.sample(logits, *args) if self.sample else None

        self.graphs[size], (self.logits[size], self.ids[size]) = capture_graph(step, self.pool)

    def run(self, batch: Batch) -> torch.Tensor:
        """Replay the smallest bucket that holds ``batch``; float32 logits [B, vocab], and the
        tokens drawn from them in ``batch.drawn_ids``."""
        bs = batch.batch_size
        size = next(b for b in self.buckets if b >= bs)
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_cache_loc[:bs].copy_(batch.out_cache_loc)
        self.req_pool_indices[:bs].copy_(batch.req_pool_indices)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        if batch.sample_args is not None:
            self.sample_args[:, :bs].copy_(batch.sample_args)
        else:
            self.sample_args[0][:bs].zero_()  # temperature 0: greedy
        if size > bs:  # padding: row 0's first token, K/V into the reserved slot 0
            self.input_ids[bs:size].zero_()
            self.positions[bs:size].zero_()
            self.out_cache_loc[bs:size].zero_()
            self.req_pool_indices[bs:size].zero_()
            self.seq_lens[bs:size].fill_(1)
            self.sample_args[0][bs:size].zero_()
        self.backend.prepare_replay(batch, size)
        self.graphs[size].replay()
        # copies: graphs share one memory pool, so the next replay may reuse these buffers
        if self.sample:
            batch.drawn_ids = self.ids[size][:bs].clone()
        return self.logits[size][:bs].clone()


class VerifyGraphs:
    """Captured speculative verify forwards: ``size`` requests of ``width`` tokens each, for the
    decode buckets up to ``max_batch`` and :data:`VERIFY_GRAPH_TOKENS` tokens. A batch comes
    padded by the verify step (every row ``width`` tokens, ``tree_mask`` [B, width, width]).
    The graph runs ``forward`` (e.g. the model up to its final hidden states, every row); the
    result is ``head`` (e.g. the logits) of the rows of ``logits_indices`` (the real nodes),
    computed after the replay, so padding rows cost no head and no output buffer."""

    def __init__(self, forward: Callable[[Batch], torch.Tensor], backend: AttentionBackend,
                 req_to_token: torch.Tensor, max_batch: int, width: int,
                 sizes: Sequence[int] | None = None, pool: object = None,
                 head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.head = head
        self.width = w = width
        self.buckets = [b for b in graph_buckets(max_batch, sizes)
                        if b * w <= VERIFY_GRAPH_TOKENS] or [1]
        self.max_batch = n = self.buckets[-1]
        dev = req_to_token.device
        self.input_ids = torch.zeros(n * w, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n * w, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n * w, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=dev)
        self.prefix_lens = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.full((n,), w, dtype=torch.int64, device=dev)
        self.extend_lens = torch.full((n,), w, dtype=torch.int64, device=dev)
        self.tree_mask = torch.eye(w, dtype=torch.bool, device=dev).repeat(n, 1, 1)
        self.rows = torch.arange(n * w, dtype=torch.int64, device=dev)
        self.req_to_token = req_to_token
        self.backend = backend
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  #: what each graph's forward returned
        #: the captured batches: their ``attn_metadata`` may hold device tensors the graphs read
        self.batches: dict[int, Batch] = {}
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        t0 = time.monotonic()
        for size in reversed(self.buckets):
            batch = self.batches[size] = self._static_batch(size)
            backend.prepare_verify_graph(batch)
            self.graphs[size], self.outputs[size] = capture_graph(lambda: forward(batch),
                                                                  self.pool)
        log.info("captured verify CUDA graphs (width %d) for batch sizes %s in %.1f s", w,
                 self.buckets, time.monotonic() - t0)

    def _static_batch(self, size: int) -> Batch:
        t, w = size * self.width, self.width
        return Batch(
            mode=ForwardMode.VERIFY, input_ids=self.input_ids[:t], positions=self.positions[:t],
            out_cache_loc=self.out_cache_loc[:t], req_pool_indices=self.req_pool_indices[:size],
            seq_lens=self.seq_lens[:size], prefix_lens=self.prefix_lens[:size],
            extend_lens=self.extend_lens[:size], req_to_token=self.req_to_token,
            seq_lens_cpu=[w] * size, prefix_lens_cpu=[0] * size, extend_lens_cpu=[w] * size,
            logits_indices=self.rows[:t], tree_mask=self.tree_mask[:size])

    def size_for(self, batch: Batch) -> int:
        """The bucket that replays ``batch``, or 0 (not padded to the width, or too large)."""
        bs = batch.batch_size
        if (bs > self.max_batch or batch.tree_mask is None
                or batch.num_tokens != bs * self.width):
            return 0
        return next(b for b in self.buckets if b >= bs)

    def run(self, batch: Batch, size: int) -> torch.Tensor:
        """Replay the graph of ``size`` (:meth:`size_for`) over ``batch``; float32 logits of
        ``batch.logits_indices``."""
        bs, t = batch.batch_size, batch.num_tokens
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_cache_loc[:t].copy_(batch.out_cache_loc)
        self.req_pool_indices[:bs].copy_(batch.req_pool_indices)
        self.prefix_lens[:bs].copy_(batch.prefix_lens)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        self.tree_mask[:bs].copy_(batch.tree_mask)
        if size > bs:  # padding requests: row 0 from position 0, K/V into the reserved slot 0
            end = size * self.width
            self.input_ids[t:end].zero_()
            self.positions[t:end].zero_()
            self.out_cache_loc[t:end].zero_()
            self.req_pool_indices[bs:size].zero_()
            self.prefix_lens[bs:size].zero_()
            self.seq_lens[bs:size].fill_(self.width)
        self.graphs[size].replay()
        out = self.outputs[size].index_select(0, batch.logits_indices)
        return self.head(out) if self.head is not None else out
