"""8-bit weight products for a few rows with the operands swapped, in Triton.

:func:`engine.runtime.quant_triton.w8_mm` at a few rows multiplies ``x`` [16 padded rows, BK]
by ``W^T`` [BK, BN]: with 16 rows on the M side of the matrix unit, Hopper's warp-group
instructions (which need 64 rows a warp group) are out of reach. :func:`w8_swap` computes the
same product transposed, ``y^T = W x^T``: each program owns ``BLOCK_N`` (64 or 128) output
features and accumulates ``acc[BLOCK_N, BM] += W[BLOCK_N, BK] @ x^T[BK, BM]``, so the weights
are the M side (eligible for the warp-group instructions with four warps) and the few rows the
N side, padded with zeros to BM = 16, 32, 64 or 128 (:func:`rows_block`).

The operands are those of ``_w8_mm``: fp8 codes multiply fp8 activation codes as they are,
int8 codes int8 codes into int32 (exact), and with unquantized activations (W8A16) the weight
tile is converted to the activations' dtype first. Activation codes are made by the quantizers
of :mod:`engine.runtime.quant_triton` (dynamic per row, static, or per row and block of ``bk``
columns for block fp8), so results equal ``w8_mm``'s up to the order of float32 sums. With
``SPLIT_K > 1`` each of that many programs per output block takes a slice of K and the last to
finish adds the slices up (:func:`engine.runtime.quant_triton._finish`).

Launched with programmatic dependent launch (:mod:`engine.runtime.triton_pdl`): every program
lets the next kernel launch at once, asks for its first weight tile to be brought into L2
before it waits for the previous kernel of the stream, and reads the activations (and writes
anything) only after the wait. The loop over K is left to Triton's software pipelining
(``num_stages``): its loads feed ``tl.dot``, so they go through shared memory ahead of use. (A
first tile held in registers over the wait instead costs each program 25 to 85 more registers
at the same launch.)
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.runtime.quant_triton import (_bits, _codes, _finish, _kind, _quantize, _row1_scale,
                                         _row_scales, _slice, _split, _workspace,
                                         quant_groups, quant_rows, rne_cast, shape_class)
from engine.runtime.triton_pdl import (launch_options, line_offsets, pdl_trigger, pdl_wait,
                                      prefetch_l2)

#: largest row count :func:`w8_swap` serves (the N side of the product: rows padded to a block
#: of 16, 32, 64 or 128, :func:`rows_block`)
MAX_ROWS = 128
#: rows from which dynamic or static per-row activation codes are made by
#: :func:`engine.runtime.quant_triton.quant_rows` before the product (one more launch), as
#: ``w8_mm`` does; below, every program quantizes the rows itself (one row's codes made first
#: took an fp8 step of Llama-3-8B's products from 2.07 to 2.55 ms on an H200)
QUANT_ROWS_FROM = 2
#: the most blocks of AMAX_BLOCK columns one row's dynamic scale is read in, unrolled (every
#: load in flight at once: one trip to L2 instead of one a block); longer rows loop
AMAX_UNROLL = 16


@triton.jit
def _as_codes(ptr, FP8: tl.constexpr):
    """A pointer to uint8 fp8 bit patterns as one to the fp8 type ``FP8`` names (0: ``ptr``
    itself), so loads feed ``tl.dot`` straight from shared memory (a bitcast of loaded bytes
    would pass them through registers first)."""
    if FP8 == 1:
        return ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    elif FP8 == 2:
        return ptr.to(tl.pointer_type(tl.float8e5), bitcast=True)
    else:
        return ptr


@triton.jit
def _first_tile_to_l2(w_ptr, offs_n, N, K, k_lo, stride_wn, BLOCK_K: tl.constexpr,
                      PDL: tl.constexpr):
    """With PDL: the program's first weight tile (constants of the step) asked into L2 before
    the wait for the previous kernel, one address a line."""
    if PDL:
        line = tl.minimum(k_lo + line_offsets(w_ptr, BLOCK_K), K - 1)
        prefetch_l2(w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * stride_wn
                    + line[None, :], PDL)


@triton.jit
def _w_tile(w_rows, k0, k_hi, n_ok, BLOCK_K: tl.constexpr, FP8: tl.constexpr,
            EVEN: tl.constexpr = False):
    """The weight codes [BLOCK_N, BLOCK_K] of columns ``k0 ..`` (zeros from ``k_hi`` on and
    past N; EVEN: every tile whole, no masks)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN:
        return tl.load(_as_codes(w_rows, FP8) + offs_k[None, :])
    return tl.load(_as_codes(w_rows, FP8) + offs_k[None, :],
                   mask=n_ok[:, None] & (offs_k < k_hi)[None, :], other=0.0)


@triton.jit
def _w_block_scales(ws_rows, k0, k_hi, offs_n, N, BLOCK_K: tl.constexpr):
    """The weight block scales [BLOCK_N] of the tile at ``k0`` (zeros past the slice: such a
    tile's products are zeros too)."""
    return tl.load(ws_rows + k0 // BLOCK_K, mask=(offs_n < N) & (offs_n * 0 + k0 < k_hi),
                   other=0.0)


@triton.jit
def _tile_scales(ws_rows, gs_rows, k0, k_hi, offs_n, offs_m, N, M, BLOCK_K: tl.constexpr):
    """The weight block scales [BLOCK_N] and the rows' group scales [BLOCK_M] (as
    :func:`engine.runtime.quant_triton.quant_groups` writes them: [K / BLOCK_K, M]) of the tile
    at ``k0``, zeros past the slice."""
    return (_w_block_scales(ws_rows, k0, k_hi, offs_n, N, BLOCK_K),
            tl.load(gs_rows + (k0 // BLOCK_K) * M, mask=(offs_m < M) & (offs_m * 0 + k0 < k_hi),
                    other=0.0))


@triton.jit
def _iteration_scales(ws_rows, gs_rows, k0, k_hi, offs_n, offs_m, N, M, BLOCK_N: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SUB: tl.constexpr):
    """(weight block scales, group scales) of the SUB (at most 4) tiles from ``k0``, as a flat
    tuple of four pairs (zeros for the pairs past SUB): an iteration's scales, loaded by the
    iteration before (separate vectors, each in the layout its product wants)."""
    zw, zg = tl.zeros((BLOCK_N,), tl.float32), tl.zeros((BLOCK_M,), tl.float32)
    w0, g0 = _tile_scales(ws_rows, gs_rows, k0, k_hi, offs_n, offs_m, N, M, BLOCK_K)
    w1, g1, w2, g2, w3, g3 = zw, zg, zw, zg, zw, zg
    if SUB > 1:
        w1, g1 = _tile_scales(ws_rows, gs_rows, k0 + BLOCK_K, k_hi, offs_n, offs_m, N, M,
                              BLOCK_K)
    if SUB > 2:
        w2, g2 = _tile_scales(ws_rows, gs_rows, k0 + 2 * BLOCK_K, k_hi, offs_n, offs_m, N, M,
                              BLOCK_K)
    if SUB > 3:
        w3, g3 = _tile_scales(ws_rows, gs_rows, k0 + 3 * BLOCK_K, k_hi, offs_n, offs_m, N, M,
                              BLOCK_K)
    return w0, g0, w1, g1, w2, g2, w3, g3


@triton.jit
def _act_tile(x_ptr, x_rows, offs_m, m_ok, k0, k_hi, xs, xr, s1, r1, gs_rows, gs_stride,
              ACT: tl.constexpr, FP8: tl.constexpr, QMAX: tl.constexpr, MANT: tl.constexpr,
              EMIN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
              ROW1: tl.constexpr, GRID: tl.constexpr = True, EVEN: tl.constexpr = False):
    """The activation operand [BLOCK_M, BLOCK_K] of the tile at ``k0`` and its per-row group
    scales [BLOCK_M] (ACT 2 and 5; ones otherwise). ACT 0: ``x`` itself; 1 and 3: ``x``
    quantized with the row scales ``xs`` (reciprocals ``xr``; ROW1: the one row's ``s1``,
    ``r1``); 2: quantized by each row's absolute maximum over the tile; 4: ``x`` holds the
    codes; 5: ``x`` holds the codes, their group scales at ``gs_rows`` + group * ``gs_stride``
    (as :func:`engine.runtime.quant_triton.quant_groups` writes them). ROW1:
    only the first row is loaded and quantized, the others are zeros. GRID: as
    :func:`engine.runtime.quant_triton._quantize`'s."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    k_ok = offs_k < k_hi
    sg = tl.full((BLOCK_M,), 1.0, tl.float32)
    if ACT == 0:
        a = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    elif ACT == 4 or ACT == 5:
        a = tl.load(_as_codes(x_rows, FP8) + offs_k[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if ACT == 5:
            sg = tl.load(gs_rows + (k0 // BLOCK_K) * gs_stride, mask=m_ok, other=0.0)
    else:
        if ROW1 and EVEN:
            x = tl.load(x_ptr + offs_k[None, :]).to(tl.float32)
        elif ROW1:  # (loaded as [1, BLOCK_K]: the padded operand then keeps the load's layout,
            # a few contiguous codes a thread and row stored together, not one byte a store)
            x = tl.load(x_ptr + offs_k[None, :], mask=k_ok[None, :], other=0.0).to(tl.float32)
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
        if ACT == 2:
            sg = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12), QMAX)
            rg = tl.math.div_rn(tl.zeros_like(sg) + 1.0, sg)
            q = _quantize(x, sg[:, None], rg[:, None], FP8, QMAX, MANT, EMIN, GRID)
            if ROW1:
                sg = tl.zeros((BLOCK_M,), dtype=tl.float32) + tl.sum(sg, axis=0)
        elif ROW1:
            q = _quantize(x, s1, r1, FP8, QMAX, MANT, EMIN, GRID)
        else:
            q = _quantize(x, xs[:, None], xr[:, None], FP8, QMAX, MANT, EMIN, GRID)
        if ROW1:  # the one row's codes, the padding rows zeros
            q = tl.where((offs_m == 0)[:, None], q, 0.0)
        a = _codes(q, FP8)
    return a, sg


@triton.jit
def _tile_product(w, a, ACT: tl.constexpr, INT: tl.constexpr):
    """``w`` [BLOCK_N, BLOCK_K] @ ``a``^T [BLOCK_K, BLOCK_M]: the weights converted to the
    activations' dtype (ACT 0), int8 codes summed in int32, fp8 codes in float32."""
    if ACT == 0:
        return tl.dot(w.to(a.dtype), tl.trans(a))
    elif INT:
        return tl.dot(w, tl.trans(a), out_dtype=tl.int32)
    else:
        return tl.dot(w, tl.trans(a))


@triton.jit
def _tile_acc(acc, w, wsb, x_ptr, x_rows, offs_m, m_ok, k0, k_hi, xs, xr, s1, r1, gs_rows,
              gs_stride, ACT: tl.constexpr, INT: tl.constexpr, TILE_SCALE: tl.constexpr,
              FP8: tl.constexpr, QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, ROW1: tl.constexpr,
              GRID: tl.constexpr = True, EVEN: tl.constexpr = False, sg_given=None,
              SG_GIVEN: tl.constexpr = False):
    """``acc`` [BLOCK_N, BLOCK_M] plus the tile at ``k0``: the weight codes ``w`` times the
    activations' operand (:func:`_act_tile`), scaled per tile by the weights' block scales
    ``wsb`` and the rows' group scales when TILE_SCALE (SG_GIVEN: ``sg_given``, loaded
    before, instead of the operand's)."""
    a, sg = _act_tile(x_ptr, x_rows, offs_m, m_ok, k0, k_hi, xs, xr, s1, r1, gs_rows,
                      gs_stride, ACT, FP8, QMAX, MANT, EMIN, BLOCK_M, BLOCK_K, ROW1, GRID,
                      EVEN)
    if SG_GIVEN:
        sg = sg_given
    part = _tile_product(w, a, ACT, INT)
    if TILE_SCALE:
        return acc + part.to(tl.float32) * (wsb[:, None] * sg[None, :])
    return acc + part


@triton.jit
def _w8_swap(x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, w_desc,
             M, N, K, stride_xm, stride_wn, stride_wsn, stride_ym, split_k,
             ACT: tl.constexpr, W_BLOCK_N: tl.constexpr, FP8: tl.constexpr, QMAX: tl.constexpr,
             MANT: tl.constexpr, EMIN: tl.constexpr, HAS_BIAS: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             AMAX_BLOCK: tl.constexpr, AMAX_CHUNKS: tl.constexpr, ROW1: tl.constexpr,
             SPLIT: tl.constexpr, SUB: tl.constexpr, PDL: tl.constexpr,
             ROW_EPILOGUE: tl.constexpr = False, GRID: tl.constexpr = True,
             EVEN: tl.constexpr = False, TMA: tl.constexpr = False,
             AHEAD: tl.constexpr = False, LATE: tl.constexpr = False):
    """One program: BLOCK_N outputs of every row (at most BLOCK_M), K slice ``pid_k`` of
    ``split_k``. ACT as ``_w8_mm``'s: 0 unquantized, 1 dynamic per row, 2 per row and
    BLOCK_K columns (fp8), 3 static ``xs[0]``, 4 codes with per-row scales ``xs``, 5 codes
    with per-row and BLOCK_K-column scales ``xs`` [K / BLOCK_K, M]. W_BLOCK_N
    0: one weight scale per output (applied at the end); else block scales
    ``ws[n // W_BLOCK_N, k // BLOCK_K]``. ROW1: one row, quantized here once per tile (its
    dynamic scale read in AMAX_CHUNKS unrolled blocks, or a loop when 0). SUB: tiles of
    BLOCK_K columns per iteration of the K loop, each its own loads and product (block
    scales: more weight bytes in flight per iteration than one scale block's). With
    PDL the first tile's weights are asked into L2 before the wait for the previous kernel,
    and a static activation scale (ACT 3, a constant of the step) is read; nothing else is
    read, and nothing written, before it. TMA: the weight tiles come
    through the tensor descriptor ``w_desc`` of ``w`` with [BLOCK_N, BLOCK_K] boxes (Hopper's
    bulk copies, zeros past N and K: no address per 16 bytes and thread). EVEN: every weight
    tile lies inside the weights and its slice (N a multiple of BLOCK_N, slices of whole
    steps), so its loads (and the one row's) take no masks. AHEAD (block scales, ACT 5, SUB at
    most 4): each iteration's block and group scales are loaded by the iteration before
    (:func:`_iteration_scales`), not after its first product. ROW_EPILOGUE (ROW1): the one
    row's sums are taken out of the padded [BLOCK_N, BLOCK_M] block before the epilogue,
    which then handles them as a block of one row (``_finish`` with BLOCK_M 1) instead of
    the whole block. GRID false
    (compiled for a GPU): the activations' fp8 codes rounded by the conversion instruction
    alone (:func:`engine.runtime.quant_triton._quantize`)."""
    pdl_trigger(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    INT: tl.constexpr = FP8 == 0 and ACT != 0
    TILE_SCALE: tl.constexpr = ACT == 2 or ACT == 5 or W_BLOCK_N > 0
    PER_ROW: tl.constexpr = ACT == 1 or ACT == 3 or ACT == 4
    k_lo, k_hi = _slice(K, pid_k, split_k, BLOCK_K * SUB, SPLIT)
    if W_BLOCK_N > 0:
        ws_rows = ws_ptr + (offs_n // W_BLOCK_N).to(tl.int64) * stride_wsn
    _first_tile_to_l2(w_ptr, offs_n, N, K, k_lo, stride_wn, BLOCK_K, PDL)
    # the rows' scales (s1, r1: the one row's, for ROW1)
    s1 = tl.full((), 1.0, tl.float32)
    if ACT == 3:  # (a constant of the step: read over the wait)
        s1 = tl.load(xs_ptr)
    pdl_wait(PDL)
    if ACT == 1 and ROW1 and LATE:  # (the scale in the first iteration, below)
        xs = tl.full((BLOCK_M,), 1.0, tl.float32)
    elif ACT == 1 and ROW1:
        s1 = _row1_scale(x_ptr, K, QMAX, AMAX_BLOCK, AMAX_CHUNKS)
        xs = tl.zeros((BLOCK_M,), dtype=tl.float32) + s1
    elif ACT == 1:
        xs = _row_scales(x_rows, m_ok, K, QMAX, BLOCK_M, AMAX_BLOCK)
    elif ACT == 3:
        xs = tl.zeros((BLOCK_M,), dtype=tl.float32) + s1
    elif ACT == 4:
        xs = tl.load(xs_ptr + offs_m, mask=m_ok, other=1.0)
    else:
        xs = tl.full((BLOCK_M,), 1.0, tl.float32)
    xr = tl.math.div_rn(tl.zeros((BLOCK_M,), dtype=tl.float32) + 1.0, xs)
    r1 = tl.math.div_rn(1.0, s1)
    if INT and not TILE_SCALE:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if AHEAD:  # the first iteration's scales
        nxt = _iteration_scales(ws_rows, xs_ptr + offs_m, k_lo, k_hi, offs_n, offs_m, N, M,
                                BLOCK_N, BLOCK_M, BLOCK_K, SUB)
    for k00 in range(k_lo, k_hi, BLOCK_K * SUB):
        if ACT == 1 and ROW1 and LATE:
            if k00 == k_lo:  # (after the pipeliner has asked for the first weight tiles)
                s1 = _row1_scale(x_ptr, K, QMAX, AMAX_BLOCK, AMAX_CHUNKS)
                r1 = tl.math.div_rn(1.0, s1)
        if AHEAD:  # this iteration's scales; the next iteration's asked for
            now = nxt
            nxt = _iteration_scales(ws_rows, xs_ptr + offs_m, k00 + BLOCK_K * SUB, k_hi, offs_n,
                                    offs_m, N, M, BLOCK_N, BLOCK_M, BLOCK_K, SUB)
        for j in tl.static_range(SUB):  # (tiles past the slice: masked, zero products)
            k0 = k00 + j * BLOCK_K
            if TMA:
                w = w_desc.load([pid_n * BLOCK_N, k0])
            else:
                w = _w_tile(w_rows, k0, k_hi, n_ok, BLOCK_K, FP8, EVEN)
            sg = tl.full((BLOCK_M,), 1.0, tl.float32)
            if AHEAD:
                wsb, sg = now[2 * j], now[2 * j + 1]
            elif W_BLOCK_N > 0:
                wsb = _w_block_scales(ws_rows, k0, k_hi, offs_n, N, BLOCK_K)
            else:
                wsb = tl.full((BLOCK_N,), 1.0, tl.float32)
            acc = _tile_acc(acc, w, wsb, x_ptr, x_rows, offs_m, m_ok, k0, k_hi, xs, xr, s1, r1,
                            xs_ptr + offs_m, M, ACT, INT, TILE_SCALE, FP8, QMAX, MANT, EMIN,
                            BLOCK_M, BLOCK_K, ROW1, GRID, EVEN, sg, AHEAD)
    if ACT == 1 and ROW1 and LATE:
        if k_lo >= k_hi:  # (an empty slice: its program may still finish the others' sums)
            s1 = _row1_scale(x_ptr, K, QMAX, AMAX_BLOCK, AMAX_CHUNKS)
        xs = tl.zeros((BLOCK_M,), dtype=tl.float32) + s1
    if PER_ROW:
        row_s = xs[:, None]
    else:
        row_s = tl.full((BLOCK_M, 1), 1.0, tl.float32)
    if W_BLOCK_N == 0:
        col_s = tl.load(ws_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    else:
        col_s = tl.full((1, BLOCK_N), 1.0, tl.float32)
    if ROW1 and ROW_EPILOGUE:  # the one row's sums out of the padded block, then finished
        first = offs_m == 0  # (as a block of one row: the workspace holds a row a slice)
        one = tl.arange(0, 1)
        row = tl.sum(tl.where(first[None, :], acc, 0), axis=1)[None, :]
        rs = tl.sum(tl.where(first[:, None], row_s, 0.0), axis=0)[:, None]
        _finish(row, rs, col_s, pid_n, pid_k, one, offs_n, one < 1, n_ok, bias_ptr, y_ptr,
                part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS, 1, SPLIT)
    else:
        _finish(tl.trans(acc), row_s, col_s, pid_n, pid_k, offs_m, offs_n, m_ok, n_ok,
                bias_ptr, y_ptr, part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS, BLOCK_M,
                SPLIT)


# ---------------------------------------------------------------- launch configurations

#: (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) by (activations: "a16" unquantized, "a8" per
#: row, "block" block fp8 (BLOCK_K is the scale block's); :func:`shape_class`). Starting
#: points until ``benchmarks/swap_gpu.py --search`` has chosen them on an H200: a few
#: programs per multiprocessor (132) at Llama-3-8B's shapes (K split for the 4096-output
#: layers), three tiles in flight per program, 128 columns a tile where the weights are
#: converted to 16 bits in registers (W8A16).
SWAP_CONFIGS = {("a16", "square"): (64, 128, 4, 4, 4), ("a16", "wide"): (64, 128, 2, 4, 4),
                ("a16", "deep"): (64, 128, 8, 4, 4),
                ("a8", "square"): (64, 256, 4, 4, 4), ("a8", "wide"): (128, 256, 2, 4, 4),
                ("a8", "deep"): (64, 256, 8, 4, 4),
                ("block", "square"): (64, 128, 4, 4, 4), ("block", "wide"): (128, 128, 2, 4, 4),
                ("block", "deep"): (64, 128, 8, 4, 4)}


#: where :func:`engine.runtime.quant_triton.w8_mm` hands its rows (up to its ``SWAP_ROWS``) to
#: this kernel, and at which launch: (codes "fp8" | "int8", activations as in
#: :data:`SWAP_CONFIGS`, shape class, rows up to 1 | 4 | 16 | 32 | 64 | 128) -> launch, chosen by
#: ``benchmarks/swap_gpu.py --search`` on an H200 (int8 from 2 rows and block fp8 from 2 rows
#: take the launches found for fp8 / one row; 32 to 128 rows the 16-row ones).
#: Combinations not listed keep ``w8_mm``'s own kernels (W8A16 was faster there at one row).
SMALL = {
    # (square at one row: the step search of dynamic fp8, 2.01 ms against 2.05; static even)
    ("fp8", "a8", "square", 1): (128, 256, 4, 4, 4), ("fp8", "a8", "wide", 1): (64, 512, 1, 4, 3),
    ("fp8", "a8", "deep", 1): (128, 256, 4, 4, 4),
    ("fp8", "a8", "square", 4): (64, 256, 1, 4, 6), ("fp8", "a8", "wide", 4): (128, 256, 1, 8, 3),
    ("fp8", "a8", "deep", 4): (64, 256, 4, 4, 4),
    ("fp8", "a8", "square", 16): (64, 256, 1, 4, 6), ("fp8", "a8", "wide", 16): (128, 256, 1, 8, 3),
    ("fp8", "a8", "deep", 16): (64, 256, 1, 4, 6),
    ("int8", "a8", "square", 1): (128, 256, 4, 4, 4),
    ("int8", "a8", "wide", 1): (64, 512, 1, 4, 3), ("int8", "a8", "deep", 1): (128, 256, 4, 4, 4),
    # block fp8: chosen by the step (quant_gpu.py --step-search fp8_block; 2.23 ms against 2.39
    # at the launches before)
    ("fp8", "block", "tall", 1): (128, 128, 8, 4, 4),
    ("fp8", "block", "square", 1): (64, 128, 4, 4, 4, 2),
    ("fp8", "block", "wide", 1): (128, 128, 1, 4, 3, 2),
    ("fp8", "block", "deep", 1): (128, 128, 8, 4, 3, 2),
}
# one row of 8-bit codes into more outputs than inputs (q/k/v): all of K a program, found by
# ``swap_gpu.py --search`` and kept by ``quant_gpu.py --step-search`` (fp8 and int8 9.5 us at
# Llama-3-8B's 6144 x 4096, where the square launches take K in slices); other buckets: the
# square launches
SMALL[("fp8", "a8", "tall", 1)] = (64, 512, 1, 4, 4)
SMALL[("int8", "a8", "tall", 1)] = (64, 512, 1, 4, 4)
for _key in [key for key in SMALL if key[2] == "square"]:
    SMALL.setdefault((_key[0], _key[1], "tall", _key[3]), SMALL[_key])
for _bucket in (4, 16):
    for _cls in ("square", "tall", "wide", "deep"):
        SMALL[("int8", "a8", _cls, _bucket)] = SMALL[("fp8", "a8", _cls, _bucket)]
        SMALL[("fp8", "block", _cls, _bucket)] = SMALL[("fp8", "block", _cls, 1)]
# 17-128 rows (row blocks of 32, 64 and 128; w8_mm hands them over only up to its SWAP_ROWS):
# the 16-row launches until a search has chosen theirs (at 128 rows at most 64 outputs a
# program: the accumulator is BLOCK_N x 128 float32)
for _bucket in (32, 64, 128):
    for _key in [key for key in SMALL if key[3] == 16]:
        bn, *rest = SMALL[_key]
        SMALL[(*_key[:3], _bucket)] = (min(bn, 64) if _bucket == 128 else bn, *rest)


def rows_block(m: int) -> int:
    """The N side of the product for ``m`` rows: 16, 32, 64 or 128 (rows past m are zeros)."""
    return 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128


def small_key(w_dtype: torch.dtype, act: str | None, block: tuple[int, int] | None,
              n: int, k: int, m: int) -> tuple[str, str, str, int]:
    """The key of :data:`SMALL` for ``m`` rows of a product of these weights [n, k] and
    activations: (codes, activations, shape class, rows bucket)."""
    codes = "int8" if w_dtype == torch.int8 else "fp8"
    kind = "block" if block is not None else "a16" if act is None else "a8"
    bucket = 1 if m == 1 else 4 if m <= 4 else rows_block(m)
    return codes, kind, swap_class(n, k), bucket


def small_config(w_dtype: torch.dtype, act: str | None, block: tuple[int, int] | None,
                 n: int, k: int, m: int) -> tuple | None:
    """The launch :data:`SMALL` gives ``m`` rows of a product of these weights and activations,
    or None (this kernel does not serve it)."""
    return SMALL.get(small_key(w_dtype, act, block, n, k, m))


def swap_class(n: int, k: int) -> str:
    """:func:`shape_class`, with "square" weights of more outputs than inputs (fused q/k/v)
    their own class "tall" (``ENGINE_SWAP_TALL=0``: square, the launches before)."""
    cls = shape_class(n, k)
    if cls == "square" and n > k and _flag("ENGINE_SWAP_TALL", True):
        return "tall"
    return cls


def _flag(name: str, default: bool) -> bool:
    """The environment's choice of one of this kernel's forms, for A/B runs: ``name`` "1" on,
    "0" off, anything else (or unset) ``default``."""
    value = os.environ.get(name)
    return value == "1" if value in ("0", "1") else default


def group_codes(k: int, bk: int) -> bool:
    """Whether rows of ``k`` columns quantized per group of ``bk`` (block fp8) are quantized
    first, by :func:`engine.runtime.quant_triton.quant_groups` (one more launch; whole
    power-of-two groups), and the product reads codes and group scales instead of quantizing
    each tile with a reduction across the program (the default: on an H200 the Llama-3-8B
    step's block fp8 products took 2.54 ms against 2.59 at one row, 2.76 against 3.18 at 4
    rows; ``ENGINE_SWAP_GROUP_CODES=0``: each tile quantized in the product, for A/B runs)."""
    return (_flag("ENGINE_SWAP_GROUP_CODES", True) and k % bk == 0
            and bk == triton.next_power_of_2(bk))


def producer_codes() -> bool:
    """Whether a decoder's norm and SiLU-and-mul kernels write block fp8 products' inputs as
    group codes (:meth:`engine.runtime.linear.QuantMethod.group_codes`) where the product
    would quantize them first (:func:`takes_group_codes`), so no quantization launch runs
    between them (the default: on an H100 Llama-3-8B's block fp8 linear layers took 2.67 ms a
    step against 2.77 at one row, the model end to end within its rounds' spread, ahead in
    most; ``ENGINE_PRODUCER_CODES=0``: off, A/B runs)."""
    return _flag("ENGINE_PRODUCER_CODES", True)


def takes_group_codes(w: torch.Tensor, block: tuple[int, int], m: int) -> bool:
    """Whether ``m`` rows of a product of block-scaled ``w`` (activations quantized per group
    of ``block[1]`` columns), as :func:`engine.runtime.quant_triton.w8_mm` routes them, run
    here from group codes made first (:func:`group_codes`), so that codes made by the kernel
    before (act ``"group_codes"``) are what the product reads either way."""
    from engine.runtime import quant_triton

    n, k = w.shape
    bk = block[1]
    return (m <= min(quant_triton.SWAP_ROWS, MAX_ROWS) and group_codes(k, bk)
            and small_config(w.dtype, "group", block, n, k, m) is not None)


def tma(w_dtype: torch.dtype) -> bool:
    """Whether products of ``w_dtype`` codes read their weight tiles through tensor descriptors
    where the GPU and the weights allow: fp8 codes by default, with one scale an output or block
    scales (on an H200 the Llama-3-8B step's one-row fp8 products took 1.93 ms with them against
    1.95 without, block fp8's 2.45 against 2.54 at one row, 2.69 against 2.76 at 4 and 3.13
    against 3.20 at 16; int8's 2.10 against 2.08, so int8 keeps its pointer loads).
    ``ENGINE_SWAP_TMA`` 1: every kind of codes, 0: none (A/B runs)."""
    return _flag("ENGINE_SWAP_TMA", w_dtype != torch.int8)


#: tensor descriptors of weights by (address, shape, row stride, dtype, box): a descriptor
#: holds only these, so one made for a freed weight still describes whatever takes its place
_descriptors: dict = {}


def _w_descriptor(w: torch.Tensor, bn: int, bk: int):
    """A tensor descriptor of ``w`` [N, K] with [bn, bk] boxes, or None where TMA cannot read
    it (not a GPU of compute capability 9 or later, rows not contiguous, start or row stride
    not a multiple of 16 bytes)."""
    if (w.device.type != "cuda" or torch.cuda.get_device_capability(w.device)[0] < 9
            or w.stride(1) != 1 or w.data_ptr() % 16 or w.stride(0) * w.element_size() % 16):
        return None
    key = (w.data_ptr(), tuple(w.shape), w.stride(0), w.dtype, bn, bk)
    desc = _descriptors.get(key)
    if desc is None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = _descriptors[key] = TensorDescriptor.from_tensor(w, [bn, bk])
    return desc


def even() -> bool:
    """Whether products whose weights split into whole tiles (N a multiple of BLOCK_N, every K
    slice of whole BLOCK_K * SUB steps) load their weight tiles, and one row its tiles, without
    masks (the default: as fast or faster on an H200 for every format; ``ENGINE_SWAP_EVEN=0``:
    masked loads everywhere, for A/B runs)."""
    return _flag("ENGINE_SWAP_EVEN", True)


def scales_ahead() -> bool:
    """Whether block fp8 products from group codes load each iteration's block and group
    scales an iteration ahead (up to 4 tiles an iteration; the default: on an H200 the
    Llama-3-8B step's block fp8 products took 2.47 ms with it against 2.54 at one row, 2.73
    against 2.76 at 4; ``ENGINE_SWAP_SCALES_AHEAD=0`` turns it off, for A/B runs)."""
    return _flag("ENGINE_SWAP_SCALES_AHEAD", True)


def late_scale(w_dtype: torch.dtype) -> bool:
    """Whether one row's dynamic scale is taken in the K loop's first iteration, after the
    software pipeliner has asked for the first weight tiles, instead of before the loop, whose
    tiles are then asked for only once the row's maximum is known: fp8 codes by default (on an
    H200 the Llama-3-8B step's dynamic fp8 products took 2.06 ms with it against 2.10; int8's
    2.20 against 2.10, so int8 keeps the scale before the loop). ``ENGINE_SWAP_LATE_SCALE`` 1:
    every kind, 0: none (A/B runs)."""
    return _flag("ENGINE_SWAP_LATE_SCALE", w_dtype != torch.int8)


def row_epilogue() -> bool:
    """Whether one row's epilogue takes the row out of the padded block first (the default:
    faster on an H200 with every kind of activation scale; ``ENGINE_SWAP_ROW_EPILOGUE=0``:
    the padded block's epilogue, for A/B runs)."""
    return _flag("ENGINE_SWAP_ROW_EPILOGUE", True)


def w8_swap(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, *, act: str | None = None,
            x_scale: torch.Tensor | None = None, block: tuple[int, int] | None = None,
            out_dtype: torch.dtype | None = None, bias: torch.Tensor | None = None,
            config: tuple | None = None) -> torch.Tensor:
    """``x`` [M <= MAX_ROWS, K] @ W^T for fp8/int8 ``w`` [N, K], with the arguments and results
    of :func:`engine.runtime.quant_triton.w8_mm`: ``act`` None (W8A16), "token" (dynamic per
    row), "static" (``x_scale``), "group" (fp8, per row and block of ``block[1]`` columns),
    "codes" (``x`` holds activation codes of ``w``'s kind, ``x_scale`` [M] their row scales, as
    :func:`engine.runtime.quant_triton.quant_rows` makes them; the result bfloat16 unless
    ``out_dtype``); ``w_scale`` [N], or with ``block`` = (bn, bk) [ceil(N/bn), ceil(K/bk)].
    ``config``: (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages[, SUB]), else
    :data:`SWAP_CONFIGS`' (BLOCK_K is bk with block scales; SUB tiles of it per iteration, 1
    when not given)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"w8_swap serves at most {MAX_ROWS} rows, got {m}")
    n = w.shape[0]
    if act == "group" and block is None:
        raise ValueError("activations quantized per group need block weight scales")
    fp8, mant, emin, qmax = _kind(w.dtype)
    kind = "block" if block is not None else "a16" if act is None else "a8"
    bn, bk, split, warps, stages, *rest = config or SWAP_CONFIGS[(kind, shape_class(n, k))]
    sub = rest[0] if rest else 1
    if block is not None:
        bk = block[1]
    code = {None: 0, "token": 1, "group": 2, "static": 3, "codes": 4, "group_codes": 5}[act]
    if code in (4, 5) and (x.dtype != w.dtype or x_scale is None):
        raise ValueError("activation codes need the weights' dtype and their scales")
    if code == 5 and (block is None or out_dtype is None or k % bk
                      or x_scale.shape != (m, k // bk) or x_scale.stride() != (1, m)):
        raise ValueError("group codes need block weight scales, an output dtype and their "
                         "scales [M, K / group] column-major")
    y = torch.empty((m, n), dtype=out_dtype or (torch.bfloat16 if code == 4 else x.dtype),
                    device=x.device)
    if code in (1, 3) and m >= QUANT_ROWS_FROM:  # the rows' codes first
        x, x_scale = quant_rows(x, w.dtype, static=x_scale if code == 3 else None)
        code = 4
    elif code == 2 and group_codes(k, bk):
        x, x_scale = quant_groups(x, w.dtype, bk)  # (scales [K / bk, M] in memory)
        code = 5
    bm = rows_block(m)
    split = _split(split, n, bn, bm)
    amax_block = min(1024 if m == 1 else 512, triton.next_power_of_2(k))
    # one row's scale: its whole row read in one go where that is at most AMAX_UNROLL blocks
    unroll = code == 1 and m == 1 and triton.cdiv(k, amax_block) <= AMAX_UNROLL
    part, cnt = _workspace(x.device)
    grid = (triton.cdiv(n, bn), split)
    desc = _w_descriptor(w, bn, bk) if tma(w.dtype) and code != 0 else None
    _w8_swap[grid](_bits(x), x_scale if x_scale is not None else w_scale, _bits(w), w_scale,
                   bias if bias is not None else y, y, part, cnt, desc, m, n, k, x.stride(0),
                   w.stride(0), w_scale.stride(0), y.stride(0), split, ACT=code,
                   W_BLOCK_N=block[0] if block else 0, FP8=fp8, QMAX=qmax, MANT=mant,
                   EMIN=emin, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn,
                   BLOCK_K=bk, AMAX_BLOCK=amax_block,
                   AMAX_CHUNKS=triton.cdiv(k, amax_block) if unroll else 0, ROW1=m == 1,
                   SPLIT=split > 1, SUB=sub, num_warps=warps, num_stages=stages,
                   ROW_EPILOGUE=row_epilogue(), GRID=not rne_cast(x.device),
                   EVEN=even() and n % bn == 0 and k % (bk * sub * split) == 0,
                   TMA=desc is not None,
                   AHEAD=code == 5 and scales_ahead() and sub <= 4,
                   LATE=code == 1 and m == 1 and late_scale(w.dtype),
                   **launch_options(x.device))
    return y
