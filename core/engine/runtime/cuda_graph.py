"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step launches a few hundred small kernels; on a GPU the host cannot issue them as fast
as the device runs them, so each step is captured once per bucket and replayed. The runner copies
a step's inputs into static buffers (padded to the bucket: padded requests read one token of row
0 and write their K/V into the reserved padding slot 0), replays, and returns the first rows of
the static logits. A backend that keeps a host-written plan refreshes it before each replay
(``prepare_replay``). Only decode batches of backends that declare ``supports_cuda_graph`` use
it; everything else runs eagerly.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

import torch

from engine.runtime.attention import AttentionBackend
from engine.runtime.batch import Batch, ForwardMode

log = logging.getLogger("engine.runtime")

BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


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


class DecodeGraphs:
    """Captured decode forwards for batch sizes up to ``max_batch`` (:func:`graph_buckets`)."""

    def __init__(self, forward: Callable[[Batch], torch.Tensor], backend: AttentionBackend,
                 req_to_token: torch.Tensor, max_batch: int,
                 sizes: Sequence[int] | None = None) -> None:
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
        self.req_to_token = req_to_token
        self.backend = backend
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
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
        batch = self._static_batch(size)
        backend.prepare_graph(batch)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile kernels and settle allocations outside the capture
                forward(batch)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[size] = forward(batch)
        self.graphs[size] = graph

    def run(self, batch: Batch) -> torch.Tensor:
        """Replay the smallest bucket that holds ``batch``; float32 logits [B, vocab]."""
        bs = batch.batch_size
        size = next(b for b in self.buckets if b >= bs)
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_cache_loc[:bs].copy_(batch.out_cache_loc)
        self.req_pool_indices[:bs].copy_(batch.req_pool_indices)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        if size > bs:  # padding: row 0's first token, K/V into the reserved slot 0
            self.input_ids[bs:size].zero_()
            self.positions[bs:size].zero_()
            self.out_cache_loc[bs:size].zero_()
            self.req_pool_indices[bs:size].zero_()
            self.seq_lens[bs:size].fill_(1)
        self.backend.prepare_replay(batch, size)
        self.graphs[size].replay()
        # a copy: graphs share one memory pool, so the next replay may reuse this buffer
        return self.logits[size][:bs].clone()
