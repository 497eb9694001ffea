"""One token per row of float logits on a GPU, in one Triton kernel: the sampling tail of a
step, captured in the decode CUDA graph (:class:`~engine.runtime.cuda_graph.DecodeGraphs`) or
launched after an eager forward by :class:`~engine.runtime.sampling.Sampler`.

Program ``r`` reads row ``r`` of the logits in passes of ``BLOCK`` columns (they stay in L2),
``UNROLL`` blocks a trip to L2 (each lane still sees its columns in order):

1. the maximum and its first index, NaN counted as ``-inf``: a greedy row
   (``temperature < GREEDY_TEMPERATURE`` or ``top_k == 1``) stores that index and stops (a row
   of nothing but ``-inf``/NaN gives 0);
2. a sampled row divides by its temperature and keeps, as the torch sampler does, the ``top_k``
   best (the ``k``-th largest value found by a binary search over the float's ordered bit
   pattern: 32 passes at most, counting), then of those the smallest set whose probability
   reaches ``top_p`` (the smallest threshold ``v`` whose mass strictly above is below
   ``top_p`` times the total: a binary search the same way, summing), then the tokens with at
   least ``min_p`` times the best probability (a log-space threshold);
3. the draw is the Gumbel-max trick over the kept tokens: the argmax of ``z + g`` with ``g =
   -log(-log(u))``, ``u`` uniform from Philox keyed by the row's seed at counter ``(column,
   position)``. That is an exact draw from the kept tokens' renormalised softmax, it needs no
   sort, and a row's token depends on its own logits, parameters, seed and position only:
   never on the other rows, the batch size, or whether it ran inside a graph.

Tokens tied at a top-k or top-p boundary are all kept (a sort would keep an arbitrary subset
of them). Parameters arrive as int64 vectors (as :func:`engine.runtime.batch.pack_to_device`
copies them): the float ones as their float32 bit patterns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runtime.sampling import GREEDY_TEMPERATURE

BLOCK = 2048
#: blocks a pass reads at once (their loads asked for together, then folded in column order:
#: the same results as one block a step, with a row's trips to L2 UNROLL times fewer; a
#: greedy row of 151,936 logits 22.5 -> 12.0 us on an H100)
UNROLL = 8


@triton.jit
def _load(base, cols, V, T):
    """The columns' logits divided by ``T`` in float32, NaN and masked columns as ``-inf``."""
    x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x == x, x, float("-inf"))
    return x / T


@triton.jit
def _key(z):
    """An int32 that orders like the float ``z`` (``-0.0`` just below ``+0.0``)."""
    b = z.to(tl.int32, bitcast=True)
    return (b ^ ((b >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _argmax(base, V, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """(maximum, its first column) of the row, NaN as ``-inf``; column 0 when all are."""
    offs = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    where = offs
    for c0 in range(0, V, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            cols = c0 + u * BLOCK + offs
            x = _load(base, cols, V, 1.0)
            better = x > best
            best = tl.where(better, x, best)
            where = tl.where(better, cols, where)
    m = tl.max(best, axis=0)
    return m, tl.min(tl.where(best == m, where, V), axis=0)


@triton.jit
def _count_at_least(base, V, T, v, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    n = tl.zeros((BLOCK,), tl.int32)
    for c0 in range(0, V, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            cols = c0 + u * BLOCK + offs
            n += ((_key(_load(base, cols, V, T)) >= v) & (cols < V)).to(tl.int32)
    return tl.sum(n, axis=0)


@triton.jit
def _mass_above(base, V, T, zm, floor, v, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Sum of ``exp(z - zm)`` over the columns whose key is above ``v`` and at least
    ``floor``."""
    offs = tl.arange(0, BLOCK)
    s = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, V, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            z = _load(base, c0 + u * BLOCK + offs, V, T)
            k = _key(z)
            s += tl.where((k > v) & (k >= floor), tl.exp(z - zm), 0.0)
    return tl.sum(s, axis=0)


@triton.jit
def _sample_rows(logits_ptr, stride, V, temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr,
                 pos_ptr, out_ptr, GREEDY: tl.constexpr, BLOCK: tl.constexpr,
                 UNROLL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    T = tl.load(temp_ptr + row).to(tl.int32).to(tl.float32, bitcast=True)
    top_k = tl.load(topk_ptr + row)
    m, first = _argmax(base, V, BLOCK, UNROLL)
    token = first.to(tl.int64)
    if (T >= GREEDY) & (top_k != 1) & (m > float("-inf")):
        top_p = tl.load(topp_ptr + row).to(tl.int32).to(tl.float32, bitcast=True)
        min_p = tl.load(minp_ptr + row).to(tl.int32).to(tl.float32, bitcast=True)
        zm = m / T
        hi = _key(zm)
        floor = hi * 0 - 2147483648  # the least int32 (an int64 tensor)
        if (top_k > 0) & (top_k < V):  # the largest v with at least top_k keys >= v
            lo = floor
            while lo < hi:
                mid = lo + (hi - lo + 1) // 2
                if _count_at_least(base, V, T, mid, BLOCK, UNROLL) >= top_k:
                    lo = mid
                else:
                    hi = mid - 1
            floor = lo
            hi = _key(zm)
        cut = floor
        if top_p < 1.0:  # the smallest v whose mass strictly above is below top_p of the kept
            target = top_p * _mass_above(base, V, T, zm, floor, floor - 1, BLOCK, UNROLL)
            lo = floor
            while lo < hi:
                mid = lo + (hi - lo) // 2
                if _mass_above(base, V, T, zm, floor, mid, BLOCK, UNROLL) < target:
                    hi = mid
                else:
                    lo = mid + 1
            cut = lo
        z_min = tl.where(min_p > 0.0, zm + tl.log(tl.maximum(min_p, 1e-30)), float("-inf"))
        seed = tl.load(seed_ptr + row)
        pos = tl.load(pos_ptr + row)
        offs = tl.arange(0, BLOCK)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        where = offs
        for c0 in range(0, V, BLOCK * UNROLL):
            for j in tl.static_range(UNROLL):
                cols = c0 + j * BLOCK + offs
                z = _load(base, cols, V, T)
                u = tl.rand(seed, (pos << 32) + cols.to(tl.int64))
                g = -tl.log(-tl.log(tl.maximum(u, 1e-30)))
                s = tl.where((_key(z) >= cut) & (z >= z_min) & (z > float("-inf")), z + g,
                             float("-inf"))
                better = s > best
                best = tl.where(better, s, best)
                where = tl.where(better, cols, where)
        top = tl.max(best, axis=0)
        token = tl.min(tl.where(best == top, where, V), axis=0).to(tl.int64)
    tl.store(out_ptr + row, token)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, min_p: torch.Tensor, seed: torch.Tensor,
           position: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Token ids [B] int64 of ``logits`` [B, V] (any float dtype, last dimension contiguous);
    every parameter an int64 vector [B] on the logits' device: ``temperature``, ``top_p``,
    ``min_p`` as float32 bit patterns (:func:`engine.runtime.sampling.float_bits`), ``top_k``
    (0: all), ``seed`` and ``position`` (the index of the token being drawn in the request's
    output)."""
    b, v = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = out if out is not None else torch.empty(b, dtype=torch.int64, device=logits.device)
    if b:
        block = min(BLOCK, triton.next_power_of_2(v))
        _sample_rows[(b,)](logits, logits.stride(0), v, temperature, top_k, top_p, min_p, seed,
                           position, out, GREEDY=GREEDY_TEMPERATURE, BLOCK=block,
                           UNROLL=min(UNROLL, triton.cdiv(v, block)),
                           num_warps=8 if block >= 1024 else 4)
    return out
