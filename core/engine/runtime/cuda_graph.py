"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket; prefill forwards
from graphs broken at attention (:class:`PrefillGraphs`).

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

from engine.errors import ConfigError
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


def bucket_for(buckets: Sequence[int], n: int, padding: bool = True) -> int:
    """The smallest of the sorted ``buckets`` that holds ``n``; 0 when none does, or (without
    ``padding``, ``--disable-cuda-graph-padding``) when none is exactly ``n``."""
    for b in buckets:
        if b >= n:
            return b if padding or b == n else 0
    return 0


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
                 sizes: Sequence[int] | None = None, sample: bool = True,
                 padding: bool = True) -> None:
        self.sample = sample
        #: pad a batch to the next bucket (False: replay only batches of a bucket's size)
        self.padding = padding
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

    def size_for(self, batch: Batch) -> int:
        """The bucket that replays the decode ``batch`` (:func:`bucket_for`), or 0."""
        return bucket_for(self.buckets, batch.batch_size, self.padding)

    def run(self, batch: Batch, size: int | None = None) -> torch.Tensor:
        """Replay bucket ``size`` (default: the smallest that holds ``batch``); float32 logits
        [B, vocab], and the tokens drawn from them in ``batch.drawn_ids``."""
        bs = batch.batch_size
        size = size or bucket_for(self.buckets, bs)
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
                 head: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 padding: bool = True) -> None:
        self.head = head
        self.padding = padding  #: as :attr:`DecodeGraphs.padding` (requests, not rows)
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
        return bucket_for(self.buckets, bs, self.padding)

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


#: prefill token counts captured by default (:class:`PrefillGraphs`): every 16 up to 256, then
#: every 32 up to 1024 (padding adds at most ~11 % of the tokens at 288 and ~3 % near 1024);
#: past ~1k tokens the device work of a forward outlasts the host's launches, so the launches
#: cost nothing that a graph would save
PREFILL_BUCKETS = (*range(16, 257, 16), *range(288, 1025, 32))


def prefill_buckets(max_tokens: int, sizes: Sequence[int] | None = None) -> list[int]:
    """The prefill token counts to capture: ``sizes`` (``--cuda-graph-bs-prefill``) up to
    ``max_tokens``, or :data:`PREFILL_BUCKETS` up to it and ``max_tokens`` itself (rounded up
    to a multiple of 16) past them."""
    if sizes:
        chosen = sorted({t for t in sizes if 1 <= t <= max_tokens})
        if not chosen:
            raise ConfigError(f"--cuda-graph-bs-prefill {' '.join(map(str, sizes))}: no token "
                              f"count within 1..{max_tokens} (--cuda-graph-max-bs-prefill)")
        return chosen
    buckets = [t for t in PREFILL_BUCKETS if t <= max_tokens]
    top = -(-max_tokens // 16) * 16
    if not buckets or buckets[-1] < top:
        buckets.append(top)
    return buckets


class _Breaks:
    """The attention backend a prefill forward under :class:`PrefillGraphs` sees: each
    attention call is a break (the owner's :meth:`PrefillGraphs._break`); the pool is the real
    one, so a model kernel that stores K/V itself does so inside the graph. It never asks
    for the new K/V as rows (the model then stores them where it can)."""

    def __init__(self, owner: "PrefillGraphs") -> None:
        self._owner = owner
        self.pool = owner.backend.pool

    def reads_new_kv(self, batch: Batch) -> bool:
        return False

    def decodes_from_pool(self, batch: Batch) -> bool:
        return False

    def attend(self, q: torch.Tensor, layer: Any, batch: Batch) -> torch.Tensor:
        return self._owner._break(layer, q, None, None)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any,
                batch: Batch) -> torch.Tensor:
        return self._owner._break(layer, q, k, v)


class PrefillGraphs:
    """Prefill (extend) forwards replayed from CUDA graphs broken at attention ("breakable"
    graphs): per token-count bucket, one graph for everything before the first layer's
    attention, one between each layer's attention and the next, one after the last. Attention
    itself runs eagerly between the replays, with the real batch and its backend's metadata
    (so any backend, any mix of prefix and new lengths); everything else, a few hundred small
    launches whose host cost exceeds their device time for a prefill of up to ~1k tokens, is
    replayed.

    ``forward(batch, backend)`` runs the model over ``batch`` with attention ``backend`` up to
    the final hidden states of ``batch.logits_indices``. A batch of ``t`` tokens is padded to the
    smallest bucket that holds it: padding tokens are token 0 at position 0, their K/V go into
    the reserved slot 0, and no attention sees them (attention covers the first ``t`` rows).
    The tensors crossing a break (q, and k/v where the model does not store them itself; the
    attention output) live in static buffers shared by every layer and bucket.

    ``capture=False`` captures nothing: :meth:`run` then goes through the same breaks, buffers
    and padding eagerly (``--debug-cuda-graph``; and how the CPU checks this class)."""

    def __init__(self, forward: Callable[[Batch, Any], torch.Tensor], backend: AttentionBackend,
                 req_to_token: torch.Tensor, max_tokens: int,
                 sizes: Sequence[int] | None = None, pool: object = None,
                 capture: bool = True, padding: bool = True) -> None:
        self.forward, self.backend = forward, backend
        self.padding = padding  #: as :attr:`DecodeGraphs.padding` (tokens)
        self.buckets = prefill_buckets(max_tokens, sizes)
        self.max_tokens = n = self.buckets[-1]
        dev = req_to_token.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.rows = torch.arange(n, dtype=torch.int64, device=dev)
        self.zero = torch.zeros(1, dtype=torch.int64, device=dev)
        self.req_to_token = req_to_token
        self.proxy = _Breaks(self)
        self._bufs: dict[tuple[Any, ...], torch.Tensor] = {}
        #: per bucket: the graphs (one more than the breaks) and the breaks, in order, each
        #: (layer spec, q buffer, k buffer or None, v buffer or None, output buffer)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.breaks: dict[int, list[tuple[Any, ...]]] = {}
        #: the final hidden states every bucket's last graph writes (a static buffer)
        self.hidden: torch.Tensor | None = None
        self._mode = "warm"  # what a break does: warm (nothing), capture, eager (attention)
        self._trace: list[tuple[Any, ...]] = []
        self._graph: Any = None
        self._real: tuple[Batch, int, Any] | None = None
        self.captured = capture
        self.pool = None
        if not capture:
            return
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        t0 = time.monotonic()
        for k, size in enumerate(reversed(self.buckets)):  # largest first: smaller reuse
            self._capture(size)
            if k == 0 or (k + 1) % 8 == 0:
                log.info("captured prefill CUDA graphs %d/%d (%d tokens), %.1f s", k + 1,
                         len(self.buckets), size, time.monotonic() - t0)
        log.info("captured breakable prefill CUDA graphs for %d token counts up to %d "
                 "(%d graphs each) in %.1f s", len(self.buckets), n,
                 len(self.graphs[self.buckets[-1]]), time.monotonic() - t0)

    # ------------------------------------------------------------------ capture

    def _static_batch(self, size: int) -> Batch:
        return Batch(
            mode=ForwardMode.EXTEND, input_ids=self.input_ids[:size],
            positions=self.positions[:size], out_cache_loc=self.out_cache_loc[:size],
            req_pool_indices=self.zero, seq_lens=self.zero + size, prefix_lens=self.zero,
            extend_lens=self.zero + size, req_to_token=self.req_to_token,
            seq_lens_cpu=[size], prefix_lens_cpu=[0], extend_lens_cpu=[size],
            logits_indices=self.rows[:size])

    def _buf(self, name: str, like: torch.Tensor) -> torch.Tensor:
        key = (name, tuple(like.shape[1:]), like.dtype)
        buf = self._bufs.get(key)
        if buf is None:
            buf = self._bufs[key] = torch.zeros((self.max_tokens, *like.shape[1:]),
                                                dtype=like.dtype, device=like.device)
        return buf

    def _break(self, layer: Any, q: torch.Tensor, k: torch.Tensor | None,
               v: torch.Tensor | None) -> torch.Tensor:
        t = q.shape[0]
        qb = self._buf("q", q)
        qb[:t].copy_(q)
        kb = vb = None
        if k is not None and v is not None:
            kb, vb = self._buf("k", k), self._buf("v", v)
            kb[:t].copy_(k)
            vb[:t].copy_(v)
        ob = self._buf("out", q)
        rec = (layer, qb, kb, vb, ob)
        self._trace.append(rec)
        if self._mode == "capture":
            self._graph.capture_end()
            self._segments.append(self._graph)
            self._graph = torch.cuda.CUDAGraph()
            self._graph.capture_begin(pool=self.pool)
        elif self._mode == "eager":
            assert self._real is not None
            self._attend(rec, *self._real)
        return ob[:t]

    def _attend(self, rec: tuple[Any, ...], batch: Batch, t: int, loads: Any) -> None:
        """Break ``rec``'s attention over the first ``t`` rows, for the real ``batch``."""
        layer, qb, kb, vb, ob = rec
        if loads is not None:
            loads.wait(layer.layer_id)
        if kb is not None:
            out = self.backend.forward(qb[:t], kb[:t], vb[:t], layer, batch)
        else:
            out = self.backend.attend(qb[:t], layer, batch)
        ob[:t].copy_(out.view(ob[:t].shape))

    def _run_eager(self, size: int, batch: Batch, t: int, loads: Any) -> torch.Tensor:
        """:meth:`_run_forward` with each break's attention run at once, for the real
        ``batch`` of ``t`` tokens."""
        self._mode, self._real = "eager", (batch, t, loads)
        try:
            return self._run_forward(size)
        finally:
            self._mode, self._real = "warm", None

    def _run_forward(self, size: int) -> torch.Tensor:
        self._trace = []
        out = self.forward(self._static_batch(size), self.proxy)
        hb = self._buf("hidden", out)
        hb[:size].copy_(out)
        return hb

    def _capture(self, size: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # compile the kernels, settle the allocations; the first time with attention (the
            # static batch: one request of row 0, whose K/V go to slot 0), so that an output
            # the buffers cannot take fails here, not at a replay
            batch = self._static_batch(size)
            self.backend.prepare(batch)
            self._run_eager(size, batch, size, None)
            self._run_forward(size)
            torch.cuda.synchronize()
            self._mode, self._segments = "capture", []
            self._graph = torch.cuda.CUDAGraph()
            self._graph.capture_begin(pool=self.pool)
            try:
                self.hidden = self._run_forward(size)
            finally:
                self._graph.capture_end()
                self._mode = "warm"
            self._segments.append(self._graph)
        torch.cuda.current_stream().wait_stream(stream)
        self.graphs[size], self.breaks[size] = self._segments, self._trace
        self._segments, self._graph, self._trace = [], None, []

    # ------------------------------------------------------------------ replay

    def size_for(self, batch: Batch) -> int:
        """The bucket that replays ``batch`` (an extend batch without a tree), or 0."""
        if batch.tree_mask is not None or batch.mode is not ForwardMode.EXTEND:
            return 0
        return bucket_for(self.buckets, batch.num_tokens, self.padding)

    def run(self, batch: Batch, size: int) -> torch.Tensor:
        """The final hidden states of ``batch.logits_indices`` (``batch`` prepared by the
        attention backend; ``size`` from :meth:`size_for`)."""
        t = batch.num_tokens
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_cache_loc[:t].copy_(batch.out_cache_loc)
        if size > t:  # padding: token 0 at position 0, its K/V into the reserved slot 0
            self.input_ids[t:size].zero_()
            self.positions[t:size].zero_()
            self.out_cache_loc[t:size].zero_()
        loads = self.backend.pool.take_loads()
        try:
            if self.captured:
                graphs = self.graphs[size]
                for graph, rec in zip(graphs, self.breaks[size]):
                    graph.replay()
                    self._attend(rec, batch, t, loads)
                graphs[-1].replay()
                hidden = self.hidden
                assert hidden is not None
            else:
                hidden = self._run_eager(size, batch, t, loads)
        finally:
            if loads is not None:
                loads.wait_all()
        return hidden.index_select(0, batch.logits_rows())
