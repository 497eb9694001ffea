"""One row of 4-bit codes (the canonical packed form of
:func:`engine.runtime.quant_triton.pack_affine`) times a weight, on the CUDA cores, with as few
instructions a weight as the form allows (by default for the "square" shape class; see
:data:`engine.runtime.quant_triton.W4_NIBBLES`).

A thread holds ``VEC`` consecutive words (one 16-byte load) of several output rows, so the
``VEC`` activations a slice of those words multiplies are loaded, widened and scaled once for
all of the thread's rows. Each code becomes a float by one and-mask of its word (a subnormal
float ``q 2^(P - 149)``, P its lowest bit; codes 5-7 from the word shifted once), one FMA
takes its product with the activation (pre-scaled by ``2^(149 - P - UNIT)``), so a weight
costs about two instructions. A group's products are summed in the thread over its ``VEC``
words first and then folded in once a row: ``acc += s sum(x f) + c sum(x)``, two FMAs a row
and group for the thread's ``VEC * group / SUB`` weights of it.

A program owns ``BLOCK_N`` outputs and a slice of K of whole tiles (``8 * SUB`` columns),
``TILES`` tiles an iteration; the next iteration's words load at the start of each. The first
iteration's words load before the wait for the previous kernel (they are weights): with
``split`` 0 each program's slice is one iteration, so all of a layer's words are in
registers before it may start (a layer small enough to fit in one wave). Slices of K sum
through a workspace (:func:`_finish_row`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runtime.gemv_triton import UNIT
from engine.runtime.quant_triton import (_affine_constants, _slice, _split, _workspace,
                                         shape_class)
from engine.runtime.triton_pdl import launch_options, pdl_trigger, pdl_wait

#: (BLOCK_N, TILES, split (0: one iteration a program), warps, VEC[, PRE_CONST: 1 when left
#: out]) by shape class
CONFIGS = {"square": (64, 2, 0, 4, 4), "wide": (64, 2, 4, 4, 4), "deep": (64, 2, 0, 4, 4)}


@triton.jit
def _load_tile(q_rows, t, n_tiles, n_ok2, SUB: tl.constexpr, VEC: tl.constexpr,
               EVEN: tl.constexpr):
    """Words [BLOCK_N, SUB // VEC, VEC] of tile ``t`` (clamped into the rows: a tile past the
    end reads the last again, met by x = 0 or never counted). Loaded as [BLOCK_N, SUB] (a
    warp's threads along a row's words, VEC a thread), then split in registers."""
    at = q_rows + tl.minimum(t, n_tiles - 1) * SUB
    if EVEN:
        words = tl.load(at)
    else:
        words = tl.load(at, mask=n_ok2, other=0)
    return tl.reshape(words, (words.shape[0], SUB // VEC, VEC))


@triton.jit
def _load_iteration(q_rows, t, n_tiles, n_ok2, SUB: tl.constexpr, VEC: tl.constexpr,
                    TILES: tl.constexpr, EVEN: tl.constexpr):
    """The words of tiles ``t .. t + TILES - 1`` (4 values; past TILES a 0, never used)."""
    w0 = _load_tile(q_rows, t, n_tiles, n_ok2, SUB, VEC, EVEN)
    w1 = 0
    w2 = 0
    w3 = 0
    if TILES > 1:
        w1 = _load_tile(q_rows, t + 1, n_tiles, n_ok2, SUB, VEC, EVEN)
    if TILES > 2:
        w2 = _load_tile(q_rows, t + 2, n_tiles, n_ok2, SUB, VEC, EVEN)
        w3 = _load_tile(q_rows, t + 3, n_tiles, n_ok2, SUB, VEC, EVEN)
    return w0, w1, w2, w3


@triton.jit
def _constants(s_ptr, b_ptr, k0, offs_n, N, K, GROUP: tl.constexpr, EVEN: tl.constexpr):
    """The scale and offset (in units of 2^-UNIT) [BLOCK_N, 1] of rows ``offs_n`` for the
    group holding column ``k0`` (zeros past K; EVEN: the group clamped into K instead, for a
    slice past the end that never uses them). Loaded as [BLOCK_N] vectors: what changes
    layout to meet the words' sums is then these, not the [BLOCK_N, SUB // VEC] sums at every
    fold (as a [BLOCK_N, 1] load, coalesced one row a thread, would make Triton do with 8 rows
    a thread)."""
    if EVEN:
        at = tl.minimum(k0 // GROUP, (K - 1) // GROUP) * N + offs_n
        s, b = _affine_constants(tl.load(s_ptr + at), tl.load(b_ptr + at))
    else:
        at = (k0 // GROUP) * N + offs_n
        ok = (offs_n < N) & (offs_n * 0 + k0 < K)
        s, b = _affine_constants(tl.load(s_ptr + at, mask=ok, other=0.0),
                                 tl.load(b_ptr + at, mask=ok, other=0.0))
    return s[:, None], (b * 2.0 ** -UNIT)[:, None]


@triton.jit
def _tile_sum(words, t, x_ptr, s_ptr, b_ptr, offs_n, N, K, sa, ca, sb, cb,
              GROUP: tl.constexpr, SUB: tl.constexpr, VEC: tl.constexpr, EVEN: tl.constexpr,
              PRE: tl.constexpr):
    """Tile ``t``'s products [BLOCK_N, SUB // VEC] in units of 2^-UNIT, each group folded in
    once a row (columns past K: x = 0, constants 0). PRE: the tile's one or two folds take the
    constants given (``sa``, ``ca``; ``sb``, ``cb``), loaded by the caller."""
    PACK: tl.constexpr = 8 * SUB
    GS: tl.constexpr = GROUP // SUB
    FOLD: tl.constexpr = GS if GS < 8 else 8
    # (sums of the words' layout: a fresh tensor would take another, converted at every fold)
    acc = tl.sum(tl.zeros_like(words).to(tl.float32), axis=2)
    high = words >> 12  # codes 5-7 at bits 8-19: one shift a word, not one a code
    for j in tl.static_range(8):
        # [1, SUB // VEC, VEC] pointers (not a reshaped load): the load then takes the layout
        # of its use, the words' (a reshape's result would be converted through shared memory)
        cols = (t * PACK + j * SUB + tl.arange(0, SUB // VEC)[None, :, None] * VEC
                + tl.arange(0, VEC)[None, None, :])
        if EVEN:
            xv = tl.load(x_ptr + cols).to(tl.float32)
        else:
            xv = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        # code j as the subnormal float q 2^(P - 149), P its lowest bit; x times 2^(149 - P -
        # UNIT) makes the product q x 2^-UNIT
        if j < 5:
            f = (words & (15 << (4 * j))).to(tl.float32, bitcast=True)
            xu = xv * 2.0 ** (149 - 4 * j - UNIT)
        else:
            f = (high & (15 << (4 * j - 12))).to(tl.float32, bitcast=True)
            xu = xv * 2.0 ** (161 - 4 * j - UNIT)
        if j % FOLD == 0:
            part = xu * f
            xs = xv
        else:
            part += xu * f
            xs += xv
        if j % FOLD == FOLD - 1:
            if PRE and j < FOLD:
                s, c = sa, ca
            elif PRE:
                s, c = sb, cb
            else:
                s, c = _constants(s_ptr, b_ptr, t * PACK + (j + 1 - FOLD) * SUB, offs_n, N,
                                  K, GROUP, EVEN)
            acc += tl.sum(part, axis=2) * s
            acc += tl.sum(xs, axis=2) * c
    return acc


@triton.jit
def _iteration_sum(acc, w0, w1, w2, w3, t, x_ptr, s_ptr, b_ptr, offs_n, N, K, s0a, c0a, s0b,
                   c0b, s1a, c1a, s1b, c1b, GROUP: tl.constexpr, SUB: tl.constexpr,
                   VEC: tl.constexpr, TILES: tl.constexpr, EVEN: tl.constexpr,
                   PRE: tl.constexpr):
    """``acc`` plus the products of tiles ``t .. t + TILES - 1`` (words ``w0`` ...; PRE: the
    first two tiles' constants given, see :func:`_tile_sum`)."""
    acc += _tile_sum(w0, t, x_ptr, s_ptr, b_ptr, offs_n, N, K, s0a, c0a, s0b, c0b,
                    GROUP, SUB, VEC, EVEN, PRE)
    if TILES > 1:
        acc += _tile_sum(w1, t + 1, x_ptr, s_ptr, b_ptr, offs_n, N, K, s1a, c1a, s1b,
                         c1b, GROUP, SUB, VEC, EVEN, PRE)
    if TILES > 2:
        acc += _tile_sum(w2, t + 2, x_ptr, s_ptr, b_ptr, offs_n, N, K, 0.0, 0.0, 0.0,
                         0.0, GROUP, SUB, VEC, EVEN, False)
        acc += _tile_sum(w3, t + 3, x_ptr, s_ptr, b_ptr, offs_n, N, K, 0.0, 0.0, 0.0,
                         0.0, GROUP, SUB, VEC, EVEN, False)
    return acc


@triton.jit
def _finish_row(y, pid_n, pid_k, offs_n, n_ok, bias_ptr, y_ptr, part_ptr, cnt_ptr, N,
                SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Write the row ``y`` [BLOCK_N] (this slice's sums, float32) plus the bias: directly with
    one slice; else through the workspace, the last of the SPLIT slices to arrive adding all of
    them up in one load (SPLIT a constant: the partials' loads are issued together, not one
    round trip to L2 each)."""
    if SPLIT == 1:
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        tl.store(part_ptr + pid_k * N + offs_n, y, mask=n_ok)
        tl.debug_barrier()  # every thread's partials issued before the release below
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            SP: tl.constexpr = triton.next_power_of_2(SPLIT)
            k = tl.arange(0, SP)[:, None]
            parts = tl.load(part_ptr + k * N + offs_n[None, :], mask=(k < SPLIT) & n_ok[None, :],
                            other=0.0, cache_modifier=".cg")
            total = tl.sum(parts, axis=0)
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            tl.store(y_ptr + offs_n, total.to(y_ptr.dtype.element_ty), mask=n_ok)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)


@triton.jit
def _gemv_nibbles(x_ptr, q_ptr, s_ptr, b_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, N, K,
                  stride_qn, GROUP: tl.constexpr, SUB: tl.constexpr,
                  VEC: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                  STREAM: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                  EVEN: tl.constexpr, PRE_CONST: tl.constexpr, PDL: tl.constexpr):
    """TILES (1, 2 or 4) tiles an iteration; STREAM: more than one iteration a program (the
    next iteration's words load at the start of each), else exactly one. PRE_CONST: with one
    iteration of at most 2 tiles and at most two groups a tile, the groups' constants are
    loaded before the wait too (weights), not after it."""
    FOLD: tl.constexpr = GROUP // SUB if GROUP // SUB < 8 else 8
    PRE: tl.constexpr = PRE_CONST and not STREAM and TILES <= 2 and FOLD >= 4
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_n2 = offs_n[:, None]
    n_ok2 = n_ok[:, None]
    q_rows = q_ptr + offs_n2.to(tl.int64) * stride_qn + tl.arange(0, SUB)[None, :]
    n_tiles = tl.cdiv(K, 8 * SUB)
    t_lo, t_hi = _slice(n_tiles, pid_k, SPLIT, TILES, SPLIT > 1)
    pdl_trigger(PDL)
    # the first iteration's words are weights: loaded before the wait
    w0, w1, w2, w3 = _load_iteration(q_rows, t_lo, n_tiles, n_ok2, SUB, VEC, TILES, EVEN)
    s0a, c0a, s0b, c0b, s1a, c1a, s1b, c1b = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    if PRE:
        k_lo = t_lo * 8 * SUB
        s0a, c0a = _constants(s_ptr, b_ptr, k_lo, offs_n, N, K, GROUP, EVEN)
        if FOLD == 4:
            s0b, c0b = _constants(s_ptr, b_ptr, k_lo + 4 * SUB, offs_n, N, K, GROUP,
                                  EVEN)
        if TILES > 1:
            s1a, c1a = _constants(s_ptr, b_ptr, k_lo + 8 * SUB, offs_n, N, K, GROUP,
                                  EVEN)
            if FOLD == 4:
                s1b, c1b = _constants(s_ptr, b_ptr, k_lo + 12 * SUB, offs_n, N, K, GROUP,
                                      EVEN)
    pdl_wait(PDL)
    acc = tl.sum(tl.zeros_like(w0).to(tl.float32), axis=2)  # (see _tile_sum)
    if STREAM:
        for t0 in range(t_lo, t_hi, TILES):
            c0, c1, c2, c3 = w0, w1, w2, w3
            w0, w1, w2, w3 = _load_iteration(q_rows, t0 + TILES, n_tiles, n_ok2, SUB, VEC,
                                             TILES, EVEN)
            acc = _iteration_sum(acc, c0, c1, c2, c3, t0, x_ptr, s_ptr, b_ptr, offs_n, N,
                                 K, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, GROUP, SUB,
                                 VEC, TILES, EVEN, False)
    elif t_lo < t_hi:  # one iteration (tiles past the slice's end meet x = 0: past K)
        acc = _iteration_sum(acc, w0, w1, w2, w3, t_lo, x_ptr, s_ptr, b_ptr, offs_n, N, K,
                             s0a, c0a, s0b, c0b, s1a, c1a, s1b, c1b, GROUP, SUB, VEC, TILES,
                             EVEN, PRE)
    _finish_row(tl.sum(acc, axis=1) * 2.0 ** UNIT, pid_n, pid_k, offs_n, n_ok, bias_ptr, y_ptr,
                part_ptr, cnt_ptr, N, SPLIT, HAS_BIAS)


def serves(x: torch.Tensor, bits: int, group: int, sub: int) -> bool:
    """Whether :func:`gemv_nibbles` takes this product (one row of 16-bit activations, 4-bit
    codes in slices of 16 or 32 columns, groups of whole slices)."""
    return (x.shape[0] == 1 and bits == 4 and x.dtype in (torch.bfloat16, torch.float16)
            and sub in (16, 32) and group % sub == 0)


def gemv_nibbles(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias_: torch.Tensor,
                 group: int, sub: int, bias: torch.Tensor | None = None,
                 config: tuple | None = None) -> torch.Tensor:
    """``x`` [1, K] @ W^T for 4-bit codes ``q`` [N, tiles * sub] (:func:`pack_affine`'s layout)
    with ``scale`` / ``bias_`` [K / group, N] (float32, or the 16-bit compact form).
    ``config``: as :data:`CONFIGS`'s entries."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    k = x.shape[1]
    n = q.shape[0]
    bn, tiles, split, warps, vec, pre = (tuple(config or CONFIGS[shape_class(n, k)]) + (1,))[:6]
    if tiles not in (1, 2, 4):
        raise ValueError(f"tiles an iteration must be 1, 2 or 4, got {tiles}")
    n_tiles = triton.cdiv(k, 8 * sub)
    steps = triton.cdiv(n_tiles, tiles)  # iterations of the whole K
    split = _split(steps if split == 0 else min(split, steps), n, bn, 1)
    stream = triton.cdiv(steps, split) > 1
    part, cnt = _workspace(x.device)
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    even = n % bn == 0 and n_tiles % tiles == 0 and k % (8 * sub) == 0
    _gemv_nibbles[(triton.cdiv(n, bn), split)](
        x, q, scale, bias_, bias if bias is not None else y, y, part, cnt, n, k, q.stride(0),
        GROUP=group, SUB=sub, VEC=min(vec, sub), BLOCK_N=bn, TILES=tiles,
        STREAM=stream, HAS_BIAS=bias is not None, SPLIT=split, EVEN=even, PRE_CONST=bool(pre),
        num_warps=warps, num_stages=1, **launch_options(x.device))
    return y
