"""Matrix-vector products for a few rows (decode at small batch) on a GPU, in Triton.

At batch 1-4 a linear layer costs the time to read its weight once; what matters is keeping
enough loads in flight on every multiprocessor, not the arithmetic. :func:`gemv` computes
``y = x W^T`` for

- float weights ``[N, K]`` (the dense model's);
- 8-bit codes ``[N, K]`` (fp8 or int8) with per-output-row scales or ``[N/bn, K/bk]`` block
  scales, the activations unquantized or quantized exactly as
  :func:`engine.runtime.quant_triton.w8_mm` quantizes them (per row, dynamic or static; per
  row and block for block fp8);

and :func:`gemv_affine` the weight-only integer formats in the canonical packed form of
:func:`engine.runtime.quant_triton.pack_affine`.

One program owns ``BLOCK_N`` outputs of every row and one of ``split_k`` slices of K. Products
accumulate elementwise (float32; int32 for int8 codes) over the slice and are summed once at
the end. With ``split_k > 1`` each slice stores its partial sums in a workspace and bumps an
atomic counter of its output block; the slice that arrives last adds the partials up, applies
the bias and writes the result, and resets the counter: still one launch, so a small layer
(o_proj, down_proj at 4096 outputs) gets enough programs to fill the GPU. The workspace and
counters belong to the device and are allocated on the first call (before any graph capture);
calls on one stream never overlap, so one workspace serves them all.

Packed 4-bit codes are eight weights per 4 bytes, so the affine kernel is bound by its
arithmetic per weight, not its loads: one or two integer operations make each code a float (by
its bit pattern), one FMA per row takes the product, and a group's scale and bias load once and
come in at the group's end (:func:`_gemv_affine`).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.runtime.fused_triton import _round
from engine.runtime.quant_triton import (_affine_constants, _bits, _finish, _group_affine,
                                         _kind, _quantize, _row_scales, _slice, _split,
                                         _workspace, _x_slice, fp8_from_bits, shape_class)
from engine.runtime.triton_pdl import (launch_options, line_offsets, pdl_enabled, pdl_trigger,
                                      pdl_wait, prefetch_l2)

#: largest row count these kernels serve (more rows: ``tl.dot`` kernels or cuBLAS)
MAX_ROWS = 4


def early() -> bool:
    """One-row float products through :func:`gemv_early` (their weights loaded before the
    wait); ``ENGINE_GEMV_EARLY=0`` turns it off (read at each launch)."""
    return os.environ.get("ENGINE_GEMV_EARLY", "1") != "0"


def dense_rows(device: torch.device) -> int:
    """Rows up to which a dense half-precision layer on ``device`` uses :func:`gemv` instead of
    cuBLAS: ``ENGINE_GEMV_DENSE_ROWS`` where set, else 1 where kernels launch with PDL (one
    row: on par with cuBLAS alone, and it overlaps its neighbours' tails; four rows are half
    cuBLAS's speed), else 0."""
    rows = os.environ.get("ENGINE_GEMV_DENSE_ROWS")
    if rows is not None:
        return min(MAX_ROWS, int(rows))
    return 1 if pdl_enabled(device) else 0


@triton.jit
def _rstd(x_rows, r_rows, m_ok, K, eps, dt: tl.constexpr, HAS_RES: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK: tl.constexpr):
    """1 / rms of each row of ``x`` (+ ``r``, the sum rounded to ``dt``), as
    :func:`engine.runtime.fused_triton.add_rms_norm` computes it."""
    sq = tl.zeros((BLOCK_M, BLOCK), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        ok = m_ok[:, None] & (offs < K)[None, :]
        v = tl.load(x_rows + offs[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_RES:
            v = _round(v + tl.load(r_rows + offs[None, :], mask=ok, other=0.0).to(tl.float32),
                       dt)
        sq += v * v
    return 1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps)


@triton.jit
def _store_residual(x_rows, r_rows, ro_rows, m_ok, K, dt: tl.constexpr, BLOCK: tl.constexpr):
    """``x + r`` rounded to ``dt`` into ``ro`` for the rows ``x_rows`` / ``r_rows`` /
    ``ro_rows`` [BLOCK_M, 1] (the residual stream a fused norm passes on)."""
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        ok = m_ok[:, None] & (offs < K)[None, :]
        v = tl.load(x_rows + offs[None, :], mask=ok, other=0.0).to(tl.float32) \
            + tl.load(r_rows + offs[None, :], mask=ok, other=0.0).to(tl.float32)
        tl.store(ro_rows + offs[None, :], v.to(dt), mask=ok)


@triton.jit
def _gemv(x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
          stride_xm, stride_wn, stride_wsn, stride_ym, split_k,
          res_ptr, nw_ptr, res_out_ptr, eps, stride_rm, stride_rom,
          CODES: tl.constexpr, ACT: tl.constexpr, W_BLOCK_N: tl.constexpr, FP8: tl.constexpr,
          QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, HAS_BIAS: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          SPLIT: tl.constexpr, AMAX_BLOCK: tl.constexpr,
          PRE: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr):
    """CODES 0: float weights; 1: 8-bit codes (FP8 0 int8, 1 e4m3, 2 e5m2) with per-row scales
    ``ws[n]`` (W_BLOCK_N 0) or block scales ``ws[n // W_BLOCK_N, k // BLOCK_K]``. ACT as in
    ``_w8_mm``: 0 unquantized, 1 dynamic per row, 2 per row and block (fp8), 3 static
    ``xs[0]``. With PDL the first tile of the program's weights (one address a cache line)
    is asked into L2 before the wait for the previous kernel.

    PRE (float weights, ACT 0) makes the input from the previous layer's output on the fly,
    rounded where the separate kernel rounds: 1, ``silu(x[:, :K]) * x[:, K:2K]`` (the gate/up
    projection's output, as ``fused_triton.silu_and_mul``); 2, RMSNorm of ``x`` (+ the
    residual ``res`` when HAS_RES) times ``nw``, as ``fused_triton.add_rms_norm``: every
    program computes the rows' norms, program (0, 0) also stores ``x + res`` at
    ``res_out``."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    k_lo, k_hi = _slice(K, pid_k, split_k, BLOCK_K, SPLIT)
    pdl_trigger(PDL)
    if PDL:
        first = tl.minimum(k_lo + line_offsets(w_ptr, BLOCK_K), K - 1)
        prefetch_l2(w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * stride_wn
                    + first[None, :], PDL)
    pdl_wait(PDL)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    dt: tl.constexpr = y_ptr.dtype.element_ty
    if PRE == 2:
        r_rows = res_ptr + offs_m.to(tl.int64)[:, None] * stride_rm
        rstd = _rstd(x_rows, r_rows, m_ok, K, eps, dt, HAS_RES, BLOCK_M, BLOCK_K)[:, None]
        if HAS_RES:
            if (pid_n == 0) & (pid_k == 0):  # the residual stream, once
                _store_residual(x_rows, r_rows,
                                res_out_ptr + offs_m.to(tl.int64)[:, None] * stride_rom, m_ok,
                                K, dt, BLOCK_K)
    INT: tl.constexpr = CODES == 1 and FP8 == 0 and ACT != 0
    TILE_SCALE: tl.constexpr = ACT == 2 or W_BLOCK_N > 0
    if W_BLOCK_N > 0:
        ws_rows = ws_ptr + (offs_n // W_BLOCK_N).to(tl.int64) * stride_wsn
    if ACT == 1:  # the rows' scales from their absolute maxima (x stays in cache)
        xs = _row_scales(x_rows, m_ok, K, QMAX, BLOCK_M, AMAX_BLOCK)
    elif ACT == 3:
        xs = tl.zeros((BLOCK_M,), dtype=tl.float32) + tl.load(xs_ptr)
    if ACT == 1 or ACT == 3:
        xr = tl.math.div_rn(tl.zeros((BLOCK_M,), dtype=tl.float32) + 1.0, xs)
    if INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        if CODES == 1:
            w = fp8_from_bits(w, FP8)
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if PRE == 1:  # silu(gate) rounded, times up, rounded
            g = x.to(tl.float32)
            u = tl.load(x_rows + K + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
            a = _round(_round(g * tl.sigmoid(g), dt) * u, dt)
        elif PRE == 2:
            v = x.to(tl.float32)
            if HAS_RES:
                v = _round(v + tl.load(r_rows + offs_k[None, :],
                                       mask=m_ok[:, None] & k_ok[None, :], other=0.0
                                       ).to(tl.float32), dt)
            nw = tl.load(nw_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            a = _round(_round(v * rstd, dt) * nw, dt)
        elif ACT == 0:
            a = x.to(tl.float32)
        elif ACT == 2:
            xf = x.to(tl.float32)
            sg = tl.math.div_rn(tl.maximum(tl.max(tl.abs(xf), axis=1), 1e-12), QMAX)
            rg = tl.math.div_rn(tl.zeros_like(sg) + 1.0, sg)
            a = _quantize(xf, sg[:, None], rg[:, None], FP8, QMAX, MANT, EMIN)
        else:
            a = _quantize(x.to(tl.float32), xs[:, None], xr[:, None], FP8, QMAX, MANT, EMIN)
        if INT:
            prod = a.to(tl.int32)[:, None, :] * w.to(tl.int32)[None, :, :]
        else:  # fp8 codes (a is on the grid already): their products are exact
            prod = a[:, None, :] * w.to(tl.float32)[None, :, :]
        if TILE_SCALE:
            if W_BLOCK_N > 0:
                scale = tl.load(ws_rows + k0 // BLOCK_K, mask=n_ok, other=0.0)[None, :]
                if ACT == 2:
                    scale = sg[:, None] * scale
            else:
                scale = sg[:, None] + tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc += prod * scale[:, :, None]
        else:
            acc += prod
    if ACT == 1 or ACT == 3:
        row_s = xs[:, None]
    else:
        row_s = tl.full((BLOCK_M, 1), 1.0, tl.float32)
    if CODES == 1 and W_BLOCK_N == 0:
        col_s = tl.load(ws_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    else:
        col_s = tl.full((1, BLOCK_N), 1.0, tl.float32)
    _finish(tl.sum(acc, axis=2), row_s, col_s, pid_n, pid_k, offs_m, offs_n, m_ok, n_ok,
            bias_ptr, y_ptr, part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS, BLOCK_M, SPLIT)


@triton.jit
def _gemv_affine_ref(x_ptr, q_ptr, s_ptr, b_ptr, perm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
                     M, N, K, stride_xm, stride_qn, stride_ym, split_k,
                     BITS: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
                     HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, ROUND: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    """Each weight dequantized on its own (the kernel before :func:`_gemv_affine`, kept for
    ``round_weights``, which cannot be factored, and for comparison). Per tile of SUB words
    (32/BITS slices of SUB columns, each inside one group): the codes become floats exactly
    (or'ed into the mantissa of 2^23, which is then subtracted), times the group's scale plus
    its bias (rounded to x's dtype when ROUND, as the dense copy is), times x."""
    PER: tl.constexpr = 32 // BITS
    PACK: tl.constexpr = PER * SUB
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_i = tl.arange(0, SUB)
    n_ok = offs_n < N
    m_ok = offs_m < M
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * stride_qn
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N, SUB), dtype=tl.float32)
    t_lo, t_hi = _slice(tl.cdiv(K, PACK), pid_k, split_k, 1, SPLIT)
    for t in range(t_lo, t_hi):
        words = tl.load(q_rows + (t * SUB + offs_i)[None, :], mask=n_ok[:, None], other=0)
        for j in tl.static_range(PER):
            k0 = t * PACK + j * SUB
            s, b = _group_affine(s_ptr, b_ptr, k0, N, K, offs_n, n_ok, GROUP)
            bits = ((words >> (j * BITS)) & ((1 << BITS) - 1)) | 0x4B000000
            c = bits.to(tl.float32, bitcast=True) - 8388608.0
            wv = c * s[:, None] + b[:, None]
            if ROUND:
                wv = wv.to(x_ptr.dtype.element_ty).to(tl.float32)
            x = _x_slice(x_rows, perm_ptr, k0 + offs_i, m_ok, K, HAS_PERM).to(tl.float32)
            acc += x[:, None, :] * wv[None, :, :]
    one = tl.full((1, 1), 1.0, tl.float32)
    _finish(tl.sum(acc, axis=2), one, one, pid_n, pid_k, offs_m, offs_n, m_ok, n_ok, bias_ptr,
            y_ptr, part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS, BLOCK_M, SPLIT)


#: the subnormal code floats' products and sums are kept in units of 2^-UNIT (normal numbers)
UNIT = tl.constexpr(64)


@triton.jit
def _code_values(words, J: tl.constexpr, BITS: tl.constexpr, SUBNORMAL: tl.constexpr):
    """The codes q of slice J of ``words`` as floats, exactly.

    - not SUBNORMAL: 2^BITS + q. One shift (left or right, by J) moves each code to the top
      BITS bits of the mantissa, one and-or (a LOP3) keeps it and sets the exponent of 2^BITS.
    - SUBNORMAL: q 2^(P - 149) (exponent field 0), P the code's lowest bit after at most one
      shift: a code inside the mantissa (bits below 23) is only masked (one LOP3), one across
      or above bit 23 is shifted to the top of the mantissa and masked, the highest only
      shifted (logically). Products with such a float are exact and normal once the other
      factor is scaled by 2^(149 - P - UNIT) (:func:`_to_unit`; x below 2^43 in magnitude);
      the FMA pipe takes subnormal operands at full speed. No offset to take back, so no
      cancellation either.
    """
    MASK: tl.constexpr = (1 << BITS) - 1
    TOP: tl.constexpr = 23 - BITS
    if not SUBNORMAL:
        if TOP >= J * BITS:
            moved = words << (TOP - J * BITS)
        else:
            moved = words >> (J * BITS - TOP)
        bits = (moved & (MASK << TOP)) | ((127 + BITS) << 23)
    elif J * BITS <= TOP:
        bits = words & (MASK << (J * BITS))
    elif J == 32 // BITS - 1:
        bits = (words.to(tl.uint32, bitcast=True) >> (32 - BITS)).to(tl.int32, bitcast=True)
    else:
        bits = (words >> (J * BITS - TOP)) & (MASK << TOP)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _to_unit(v, J: tl.constexpr, BITS: tl.constexpr, SUBNORMAL: tl.constexpr):
    """``v`` times the power of two that makes its products with slice J's subnormal code
    floats ``q 2^(P - 149)`` come out as ``q v 2^-UNIT`` (``v`` itself for the other form)."""
    if SUBNORMAL:
        P: tl.constexpr = J * BITS if J * BITS <= 23 - BITS else (
            0 if J == 32 // BITS - 1 else 23 - BITS)
        return v * 2.0 ** (149 - P - UNIT)
    return v


@triton.jit
def _tile_affine(s_ptr, b_ptr, k0, N, K, n4, n_ok4, GROUP: tl.constexpr, BITS: tl.constexpr,
                 SUBNORMAL: tl.constexpr, EVEN: tl.constexpr):
    """The scales ``s`` and the offsets ``c`` [1, BLOCK_N, TILES, 1] of the groups holding the
    columns ``k0`` [1, 1, TILES, 1] (one per tile): ``q s + b = (2^BITS + q) s + c`` with ``c =
    b - 2^BITS s``; subnormal codes: ``c = b 2^-UNIT`` (the products' unit). EVEN: no masks
    (every output and column in bounds)."""
    if EVEN:
        at = (k0 // GROUP) * N + n4
        s, b = _affine_constants(tl.load(s_ptr + at), tl.load(b_ptr + at))
    else:
        s, b = _group_affine(s_ptr, b_ptr, k0, N, K, n4, n_ok4, GROUP)
    if SUBNORMAL:
        return s, b * 2.0 ** -UNIT
    return s, b - s * (1 << BITS)


@triton.jit
def _x_rows(x_ptr, perm_ptr, cols, M, K, stride_xm, HAS_PERM: tl.constexpr,
            BLOCK_M: tl.constexpr, EVEN: tl.constexpr):
    """x's columns ``cols`` [1, 1, TILES, SUB] of every row as float32 [BLOCK_M, 1, TILES, SUB]
    (zeros past K; rows past M repeat the last, never stored). Loaded row by row: Triton gives
    a load of fewer elements than the program has threads the layout of its use (the
    codes'), and converts a larger one through shared memory at every slice (the scales'
    [BLOCK_N, TILES] loads likewise: :func:`gemv_affine` keeps both below that); the rows
    then join in registers (a select by a constant row index)."""
    if HAS_PERM and EVEN:
        src = tl.load(perm_ptr + cols)
    elif HAS_PERM:
        src = tl.load(perm_ptr + cols, mask=cols < K, other=0)
    else:
        src = cols
    rows = tl.arange(0, BLOCK_M)[:, None, None, None]
    x = tl.zeros((BLOCK_M, 1, cols.shape[2], cols.shape[3]), dtype=tl.float32)
    for r in tl.static_range(BLOCK_M):
        row = x_ptr + tl.minimum(r, M - 1) * stride_xm  # (rows past M: the last row again)
        if EVEN:
            xr = tl.load(row + src)
        else:
            xr = tl.load(row + src, mask=cols < K, other=0.0)
        x = tl.where(rows == r, xr.to(tl.float32), x)
    return x


@triton.jit
def _words(q_rows, t, n_tiles, n_ok4, u4, SUB: tl.constexpr, TILES: tl.constexpr,
           EVEN: tl.constexpr):
    """The words of tiles ``t .. t + TILES - 1`` [1, BLOCK_N, TILES, SUB]. EVEN: unmasked, the
    tile clamped into the rows (a prefetch past the end reads the last tiles again); else
    masked, without a fill (codes past N or the last tile are finite floats that meet x = 0
    or are never stored)."""
    if EVEN:
        return tl.load(q_rows + tl.minimum(t, n_tiles - TILES) * SUB)
    return tl.load(q_rows + t * SUB, mask=n_ok4 & (t + u4 < n_tiles))


@triton.jit
def _gemv_affine(x_ptr, q_ptr, s_ptr, b_ptr, perm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
                 M, N, K, stride_xm, stride_qn, stride_ym, split_k,
                 BITS: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
                 HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, FACTOR: tl.constexpr,
                 SUBNORMAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 TILES: tl.constexpr, PREFETCH: tl.constexpr, EVEN: tl.constexpr,
                 SPLIT: tl.constexpr, PDL: tl.constexpr):
    """TILES tiles of SUB words per row and iteration (a power of two) in one load; slice j of
    every tile at once, its codes as floats f (:func:`_code_values`: 2^BITS + q, or q times a
    power of two; one or two integer operations per weight). The weight ``q s + b`` is ``f s +
    c`` (:func:`_tile_affine`; subnormal f: with s and x scaled by powers of two), and the
    products either

    - (not FACTOR) take each weight ``f s + c`` (one FMA, shared by the rows), then ``x w``
      (one FMA per row); or
    - (FACTOR) sum ``x f`` (one FMA per row) and x itself over the slices of a group, and
      fold the group in at its end: ``acc += s sum(x f) + c sum(x)`` (two FMAs per
      accumulator, once per fold: worth it when a fold spans at least 4 slices, else the
      kernel takes the other way).

    A group's scales and biases load once per group (per fold), not per slice. Groups and
    tiles relate by constants: a tile holds PER slices, a group GS; with GS not a multiple of
    PER the folds come every CHUNK = gcd(GS, PER) slices inside the tile (group 128, 4 bits:
    two per tile), else at the tile's end, or (LONG: a group of several iterations) when an
    iteration ends one, or the program's slice of K. EVEN: N a multiple of BLOCK_N and K of
    TILES tiles (no masks, no fills). PREFETCH: each iteration loads the next one's words
    first (Triton's pipeliner leaves loads that feed no ``tl.dot`` alone)."""
    PER: tl.constexpr = 32 // BITS
    PACK: tl.constexpr = PER * SUB
    GS: tl.constexpr = GROUP // SUB
    CHUNK: tl.constexpr = min(GS & -GS, PER)
    LONG: tl.constexpr = GS % (PER * TILES) == 0 and GS > PER * TILES
    FOLD: tl.constexpr = FACTOR and (GS // TILES if LONG else CHUNK) >= 4
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    # every tensor of the loop in the accumulator's rank [rows, outputs, tiles, words]: loads
    # then take layouts the products share (an expanded lower-rank load is converted through
    # shared memory at every use)
    n4 = offs_n[None, :, None, None]
    u4 = tl.arange(0, TILES)[None, None, :, None]
    i4 = tl.arange(0, SUB)[None, None, None, :]
    n_ok4 = n_ok[None, :, None, None]
    q_rows = q_ptr + n4.to(tl.int64) * stride_qn + u4 * SUB + i4  # [1, BLOCK_N, TILES, SUB]
    col_at = u4 * PACK + i4  # slice 0's columns [1, 1, TILES, SUB]
    acc = tl.zeros((BLOCK_M, BLOCK_N, TILES, SUB), dtype=tl.float32)
    if FOLD and LONG:
        accg = tl.zeros((BLOCK_M, BLOCK_N, TILES, SUB), dtype=tl.float32)
        xg = tl.zeros((BLOCK_M, 1, TILES, SUB), dtype=tl.float32)
    n_tiles = tl.cdiv(K, PACK)
    t_lo, t_hi = _slice(n_tiles, pid_k, split_k, TILES, SPLIT)
    pdl_trigger(PDL)  # (the first words are weights: they load before the wait)
    if PREFETCH:
        words = _words(q_rows, t_lo, n_tiles, n_ok4, u4, SUB, TILES, EVEN)
    elif PDL:
        first = tl.maximum(tl.minimum(t_lo, n_tiles - TILES), 0) + u4  # one address a tile
        prefetch_l2(q_ptr + tl.minimum(n4, N - 1).to(tl.int64) * stride_qn + first * SUB, PDL)
    pdl_wait(PDL)
    for t0 in range(t_lo, t_hi, TILES):
        if PREFETCH:  # the next iteration's words load while these are used
            cur = words
            words = _words(q_rows, t0 + TILES, n_tiles, n_ok4, u4, SUB, TILES, EVEN)
        else:
            cur = _words(q_rows, t0, n_tiles, n_ok4, u4, SUB, TILES, EVEN)
        k_tile = (t0 + u4) * PACK  # [1, 1, TILES, 1]
        for j in tl.static_range(PER):
            f = _code_values(cur, j, BITS, SUBNORMAL)
            x = _x_rows(x_ptr, perm_ptr, t0 * PACK + j * SUB + col_at, M, K, stride_xm,
                        HAS_PERM, BLOCK_M, EVEN)
            if FOLD:
                if LONG or j % CHUNK != 0:
                    accg += _to_unit(x, j, BITS, SUBNORMAL) * f
                    xg += x
                else:
                    accg = _to_unit(x, j, BITS, SUBNORMAL) * f
                    xg = x
                if not LONG and j % CHUNK == CHUNK - 1:  # (the chunk's first column: in K)
                    s, c = _tile_affine(s_ptr, b_ptr, k_tile + (j + 1 - CHUNK) * SUB, N, K,
                                        n4, n_ok4, GROUP, BITS, SUBNORMAL, EVEN)
                    acc += accg * s  # (two statements: two FMAs)
                    acc += xg * c
            else:
                if j % CHUNK == 0:
                    s, c = _tile_affine(s_ptr, b_ptr, k_tile + j * SUB, N, K, n4, n_ok4,
                                        GROUP, BITS, SUBNORMAL, EVEN)
                acc += x * (f * _to_unit(s, j, BITS, SUBNORMAL) + c)
        if FOLD and LONG:
            if ((t0 + TILES) % (GS // PER) == 0) | (t0 + TILES >= t_hi):
                s, c = _tile_affine(s_ptr, b_ptr, k_tile, N, K, n4, n_ok4, GROUP, BITS,
                                    SUBNORMAL, EVEN)
                acc += accg * s
                acc += xg * c
                accg = tl.zeros((BLOCK_M, BLOCK_N, TILES, SUB), dtype=tl.float32)
                xg = tl.zeros((BLOCK_M, 1, TILES, SUB), dtype=tl.float32)
    unit = tl.full((1, 1), 2.0 ** UNIT if SUBNORMAL else 1.0, tl.float32)
    one = tl.full((1, 1), 1.0, tl.float32)
    _finish(tl.sum(tl.sum(acc, axis=3), axis=2), unit, one, pid_n, pid_k, offs_m, offs_n,
            offs_m < M, n_ok, bias_ptr, y_ptr, part_ptr, cnt_ptr, N, stride_ym, split_k,
            HAS_BIAS, BLOCK_M, SPLIT)


# ---------------------------------------------------------------- launch configurations

#: (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) by (weight kind, shape class); kind: "float"
#: (16-bit weights), "w8" (8-bit codes, per-row scales), "block" (BLOCK_K is the scale
#: block's); class: :func:`engine.runtime.quant_triton.shape_class`. Chosen on an H200 by
#: ``benchmarks/gemv_gpu.py --search``.
CONFIGS = {("float", "square"): (8, 1024, 1, 4, 2), ("float", "wide"): (8, 1024, 1, 4, 2),
           ("float", "deep"): (32, 512, 2, 4, 1),
           ("w8", "square"): (8, 1024, 1, 4, 3), ("w8", "wide"): (8, 1024, 1, 4, 3),
           ("w8", "deep"): (8, 1024, 1, 4, 3),
           ("block", "square"): (32, 128, 4, 2, 2), ("block", "wide"): (32, 128, 4, 2, 2),
           ("block", "deep"): (16, 128, 4, 2, 2)}
#: launches for exact weight shapes, (kind, N, K) -> as :data:`CONFIGS`, ahead of the class's
#: (layers whose class launch leaves the GPU half idle: an MoE model's router or small output
#: projection; ``benchmarks/gemv_gpu.py --model ... --search`` finds them)
SHAPE_CONFIGS: dict[tuple[str, int, int], tuple] = {
    # Qwen3-30B-A3B's q/k/v [5120, 2048], o [2048, 4096] and router [128, 2048] (2026-12-03:
    # 7.2 / 6.3 / 2.0 us against cuBLAS's 8.0 / 9.2 / 5.4; the class launches give the router
    # 8 programs)
    ("float", 5120, 2048): (4, 2048, 1, 4, 1), ("float", 2048, 4096): (4, 2048, 1, 4, 3),
    ("float", 128, 2048): (4, 2048, 1, 4, 3)}


def launch(kind: str, n: int, k: int) -> tuple:
    """(BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) of a [n, k] weight of ``kind``."""
    return SHAPE_CONFIGS.get((kind, n, k)) or CONFIGS[(kind, shape_class(n, k))]


#: (BLOCK_N, SPLIT_K, warps, stages, TILES, FACTOR_ROWS, SUBNORMAL) for affine weights by
#: shape class (see :func:`_gemv_affine`): BLOCK_N outputs per program (at every row count),
#: K in SPLIT_K slices, ``warps``, stages > 1: each iteration prefetches the next one's words,
#: TILES tiles of SUB words (32/bits slices of SUB columns) per row and iteration (0: the
#: per-weight kernel ``_gemv_affine_ref``, for comparison), the group's affine factored out
#: of the products up to FACTOR_ROWS rows (above: each weight's affine once, shared by the
#: rows), codes as subnormal floats (1) or as 2^bits + q (0). BLOCK_N and TILES * SUB stay
#: below 32 * warps (:func:`gemv_affine` caps them), so 16 words a thread at most.
AFFINE_CONFIGS = {"square": (32, 4, 4, 2, 2, 1, 1), "wide": (128, 4, 4, 1, 2, 0, 1),
                  "deep": (64, 4, 8, 2, 4, 1, 1)}


@triton.jit
def _gemv_early(x_ptr, w_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, N, K, stride_wn, split_k,
                res_ptr, nw_ptr, res_out_ptr, eps, HAS_BIAS: tl.constexpr,
                BLOCK_N: tl.constexpr, KC: tl.constexpr, SPLIT: tl.constexpr,
                PRE: tl.constexpr, HAS_RES: tl.constexpr, NORM_BLOCK: tl.constexpr,
                PDL: tl.constexpr, ss_in_ptr=None, n_ss=0, ss_out_ptr=None,
                SS_BLOCK: tl.constexpr = 1, EPI: tl.constexpr = 0, xn_ptr=None,
                STORE_X: tl.constexpr = False):
    """One row of float weights: program (n, k) loads all of its weights, ``BLOCK_N`` outputs x
    KC columns from column ``k * KC`` on, into registers *before* it waits for the previous
    kernel, then reads x and sums. Under PDL the programs resident while the previous kernels
    run hold their weights by the time those finish, so the product pays no memory latency at
    its start (:func:`gemv`; ``ENGINE_GEMV_EARLY=0`` turns it off).

    PRE as ``_gemv``'s (the input made from the previous layer's output after the wait,
    rounded where the separate kernels round): 1, SiLU-and-mul of the gate/up row ``x`` [2K];
    2, RMSNorm of ``x`` (+ ``res`` when HAS_RES) times ``nw``, the row's norm summed in blocks
    of NORM_BLOCK by every program, program (0, 0) storing ``x + res`` at ``res_out``.

    The chained decode layer (:func:`gemv_chain`): PRE 3, RMSNorm of ``x`` (already the
    residual stream) times ``nw`` with the row's sum of squares read as the ``n_ss`` partial
    sums at ``ss_in`` that the kernel which wrote ``x`` left; EPI 1, gate/up (SiLU-and-mul in
    the epilogue): each program also loads rows ``N + n`` (the up half) and writes ``silu(g) *
    u`` for its N outputs; EPI 2, residual add: writes ``y + res`` (the next residual stream)
    and its own sum of squares of those outputs at ``ss_out[pid_n]``. EPI needs one slice of
    K (SPLIT false). STORE_X (PRE 3, one slice): the programs of the first outputs also store
    the normed input row at ``xn`` (what ``add_rms_norm`` would have written: a sparse layer's
    experts read it after its router)."""
    pdl_trigger(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    cols = pid_k * KC + tl.arange(0, KC)
    k_ok = cols < K
    w_rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * stride_wn
    w = tl.load(w_rows + cols[None, :], mask=k_ok[None, :], other=0.0)
    if EPI == 1:  # the up half's rows of the same outputs
        w2 = tl.load(w_rows + N * stride_wn + cols[None, :], mask=k_ok[None, :], other=0.0)
    if PRE == 3:  # (the norm's weights: constants)
        nw = tl.load(nw_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    dt: tl.constexpr = y_ptr.dtype.element_ty
    if EPI == 2:  # (asked for with x, not after the sums)
        res = tl.load(res_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
    if PRE == 1:  # silu(gate) rounded, times up, rounded
        u = tl.load(x_ptr + K + cols, mask=k_ok, other=0.0).to(tl.float32)
        x = _round(_round(x * tl.sigmoid(x), dt) * u, dt)
    elif PRE == 2:  # (the one row as a [1, 1] block of row pointers, as ``_gemv``'s rows)
        row = tl.zeros((1, 1), dtype=tl.int32)
        one_row = tl.full((1,), 1, tl.int1)
        rstd = tl.sum(_rstd(x_ptr + row, res_ptr + row, one_row, K, eps, dt, HAS_RES, 1,
                            NORM_BLOCK), axis=0)
        if HAS_RES:
            x = _round(x + tl.load(res_ptr + cols, mask=k_ok, other=0.0).to(tl.float32), dt)
            if (pid_n == 0) & (pid_k == 0):  # the residual stream, once
                _store_residual(x_ptr + row, res_ptr + row, res_out_ptr + row, one_row, K, dt,
                                NORM_BLOCK)
        nw = tl.load(nw_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
        x = _round(_round(x * rstd, dt) * nw, dt)
    elif PRE == 3:  # the norm from the partial sums of squares the writer of x left
        offs_s = tl.arange(0, SS_BLOCK)
        ss = tl.load(ss_in_ptr + offs_s, mask=offs_s < n_ss, other=0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
        x = _round(_round(x * rstd, dt) * nw, dt)
        if STORE_X:
            if pid_n == 0:
                tl.store(xn_ptr + cols, x.to(dt), mask=k_ok)
    acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if EPI == 0:
        one = tl.full((1, 1), 1.0, tl.float32)
        _finish(acc[None, :], one, one, pid_n, pid_k, tl.arange(0, 1), offs_n,
                tl.full((1,), 1, tl.int1), n_ok, bias_ptr, y_ptr, part_ptr, cnt_ptr, N, 0,
                split_k, HAS_BIAS, 1, SPLIT)
    else:  # (one slice: the outputs rounded where the separate kernels round)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        y = _round(acc, dt)
        if EPI == 1:  # silu(gate) rounded, times up
            up = tl.sum(w2.to(tl.float32) * x[None, :], axis=1)
            if HAS_BIAS:
                up += tl.load(bias_ptr + N + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            y = _round(y * tl.sigmoid(y), dt) * _round(up, dt)
        else:  # the residual stream and its sum of squares over these outputs
            y = _round(y + res, dt)
            tl.store(ss_out_ptr + pid_n, tl.sum(tl.where(n_ok, y * y, 0.0), axis=0))
        tl.store(y_ptr + offs_n, y.to(dt), mask=n_ok)


#: (BLOCK_N, KC columns a program, warps) of :func:`_gemv_early` by shape class
#: (``ENGINE_GEMV_EARLY_CONFIG`` = "bn,kc,warps" overrides them for a sweep); chosen on an
#: H200 by ``benchmarks/step_products_gpu.py``
EARLY_CONFIGS = {"square": (4, 4096, 4), "wide": (4, 4096, 4), "deep": (2, 16384, 8)}


def gemv_early(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               config: tuple | None = None, *, pre: int = 0,
               residual: torch.Tensor | None = None, norm_w: torch.Tensor | None = None,
               eps: float = 0.0, out_dtype: torch.dtype | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(``x`` [1, K] @ W^T for float ``w`` [N, K] through ``_gemv_early``, the residual stream
    written with ``pre`` 2 and a residual, else None), or None where it does not serve (more
    rows, rows not contiguous, more slices of K than the workspace holds). ``pre``,
    ``residual``, ``norm_w``, ``eps``: the input made in the kernel (``PRE``; ``x`` is then the
    gate/up row [1, 2K] for 1)."""
    n, k = w.shape
    if x.shape[0] != 1 or w.stride(-1) != 1 or x.stride(-1) != 1:
        return None
    env = os.environ.get("ENGINE_GEMV_EARLY_CONFIG")
    bn, kc, warps = config or (tuple(int(v) for v in env.split(",")) if env
                               else EARLY_CONFIGS[shape_class(n, k)])
    kc = min(kc, triton.next_power_of_2(k))
    split = triton.cdiv(k, kc)
    if _split(split, n, bn, 1) != split:
        return None
    part, cnt = _workspace(x.device)
    y = torch.empty((1, n), dtype=out_dtype or x.dtype, device=x.device)
    has_res = residual is not None
    res_out = torch.empty((1, k), dtype=x.dtype, device=x.device) if has_res else None
    _gemv_early[(triton.cdiv(n, bn), split)](
        x, w, bias if bias is not None else y, y, part, cnt, n, k, w.stride(0), split,
        residual if has_res else x, norm_w if norm_w is not None else y,
        res_out if has_res else y, eps, HAS_BIAS=bias is not None, BLOCK_N=bn, KC=kc,
        SPLIT=split > 1, PRE=pre, HAS_RES=has_res,
        NORM_BLOCK=min(1024, triton.next_power_of_2(k)), num_warps=warps,
        **launch_options(x.device))
    return y, res_out


def chain(device: torch.device) -> bool:
    """Whether a dense decoder layer at one row on ``device`` runs as four chained products
    (:func:`gemv_chain`): where one row of dense weights goes to these kernels
    (:func:`dense_rows`), unless ``ENGINE_GEMV_CHAIN=0`` (read at each forward)."""
    return os.environ.get("ENGINE_GEMV_CHAIN", "1") != "0" and dense_rows(device) >= 1


def chain_serves(n: int, k: int, glu: bool = False) -> bool:
    """Whether :func:`gemv_chain` serves a weight [N, K] (its launch takes K in one slice)."""
    kc = EARLY_CONFIGS[shape_class(n, k)][1]
    return k <= kc and (not glu or n % 2 == 0)


def gemv_chain(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
               sumsq: torch.Tensor | None = None, norm_w: torch.Tensor | None = None,
               eps: float = 0.0, glu: bool = False, residual: torch.Tensor | None = None,
               normed_out: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One product of a decoder layer chained at one row (``_gemv_early``'s PRE 3 / EPI 1-2):
    ``x`` [1, K] and float ``w`` [N, K] (N = 2 x inter with ``glu``), returns (y, the sums of
    squares y's programs left, or None).

    - ``sumsq`` (with ``norm_w``, ``eps``): ``x`` is the residual stream, normed in the
      kernel with the row's sum of squares from those partial sums (the previous call's);
    - ``glu``: y = ``silu(gate) * up`` [1, N / 2] of the product's two halves;
    - ``residual`` [1, N]: y = product + ``residual`` (the next residual stream), with its
      partial sums of squares for the next call's norm;
    - ``normed_out`` [1, K] (with ``sumsq``): also filled with the normed input row.

    Each matches the separate kernels' rounding (:func:`engine.runtime.fused_triton.
    add_rms_norm`, ``silu_and_mul``); the norm's sum is added in another order."""
    n, k = w.shape
    if x.shape[0] != 1 or x.stride(-1) != 1 or w.stride(-1) != 1 or not chain_serves(n, k, glu):
        raise ValueError(f"gemv_chain does not serve x {tuple(x.shape)} @ w {tuple(w.shape)}")
    if glu and residual is not None:
        raise ValueError("gemv_chain ends in SiLU-and-mul or in a residual add, not both")
    if normed_out is not None and (sumsq is None or normed_out.shape != x.shape
                                   or normed_out.dtype != x.dtype
                                   or not normed_out.is_contiguous()):
        raise ValueError("gemv_chain writes the normed row only for an input it norms, into a "
                         "contiguous tensor of the input's shape and dtype")
    bn, kc, warps = EARLY_CONFIGS[shape_class(n, k)]
    out_n = n // 2 if glu else n
    if glu:  # as many weight rows a program as the plain launch
        bn = max(1, bn // 2)
    kc = min(kc, triton.next_power_of_2(k))
    y = torch.empty((1, out_n), dtype=x.dtype, device=x.device)
    programs = triton.cdiv(out_n, bn)
    ss_out = (torch.empty(programs, dtype=torch.float32, device=x.device)
              if residual is not None else None)
    n_ss = sumsq.numel() if sumsq is not None else 0
    part, cnt = _workspace(x.device)
    _gemv_early[(programs, 1)](
        x, w, bias if bias is not None else y, y, part, cnt, out_n, k, w.stride(0), 1,
        residual if residual is not None else y, norm_w if norm_w is not None else y, y, eps,
        HAS_BIAS=bias is not None, BLOCK_N=bn, KC=kc, SPLIT=False,
        PRE=3 if sumsq is not None else 0, HAS_RES=False, NORM_BLOCK=16,
        ss_in_ptr=sumsq if sumsq is not None else y, n_ss=n_ss,
        ss_out_ptr=ss_out if ss_out is not None else y,
        SS_BLOCK=triton.next_power_of_2(max(1, n_ss)),
        EPI=1 if glu else 2 if ss_out is not None else 0,
        xn_ptr=normed_out if normed_out is not None else y, STORE_X=normed_out is not None,
        num_warps=warps, **launch_options(x.device))
    return y, ss_out


def gemv(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor | None = None, *,
         act: str | None = None, x_scale: torch.Tensor | None = None,
         block: tuple[int, int] | None = None, out_dtype: torch.dtype | None = None,
         bias: torch.Tensor | None = None, config: tuple | None = None) -> torch.Tensor:
    """``x`` [M <= MAX_ROWS, K] @ W^T. ``w`` [N, K]: float weights (``w_scale`` None), or
    fp8/int8 codes with ``w_scale`` [N] or, with ``block`` = (bn, bk), [ceil(N/bn),
    ceil(K/bk)]; ``act`` as :func:`engine.runtime.quant_triton.w8_mm`'s."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"gemv serves at most {MAX_ROWS} rows, got {m}")
    n = w.shape[0]
    codes = w_scale is not None
    if codes:
        fp8, mant, emin, qmax = _kind(w.dtype)
    else:
        fp8, mant, emin, qmax = 0, 0, 0, 1.0
        if act is not None:
            raise ValueError("float weights take unquantized activations")
    if act == "group" and block is None:
        raise ValueError("activations quantized per group need block weight scales")
    if not codes and m == 1 and config is None and early():
        done = gemv_early(x, w, bias, out_dtype=out_dtype)
        if done is not None:
            return done[0]
    kind = "block" if block is not None else "w8" if codes else "float"
    bn, bk, split, warps, stages = config or launch(kind, n, k)
    if block is not None:
        bk = block[1]
    bm = triton.next_power_of_2(m)
    bn = max(2, bn // bm)  # launches are chosen for one row: the same registers for more
    split = _split(split, n, bn, bm)
    part, cnt = _workspace(x.device)
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    code = {None: 0, "token": 1, "group": 2, "static": 3}[act]
    grid = (triton.cdiv(n, bn), split)
    _gemv[grid](_bits(x), x_scale if x_scale is not None else y, _bits(w),
                w_scale if codes else y, bias if bias is not None else y, y, part, cnt, m, n, k,
                x.stride(0), w.stride(0), w_scale.stride(0) if codes else 0, y.stride(0), split,
                y, y, y, 0.0, 0, 0,
                CODES=int(codes), ACT=code, W_BLOCK_N=block[0] if block else 0, FP8=fp8,
                QMAX=qmax, MANT=mant, EMIN=emin, HAS_BIAS=bias is not None, BLOCK_M=bm,
                BLOCK_N=bn, BLOCK_K=bk, SPLIT=split > 1,
                AMAX_BLOCK=min(1024, triton.next_power_of_2(k)),
                PRE=0, HAS_RES=False, num_warps=warps, num_stages=stages,
                **launch_options(x.device))
    return y


def _gemv_pre(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, pre: int,
              residual: torch.Tensor | None = None, norm_w: torch.Tensor | None = None,
              eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`gemv` of float weights ``w`` [N, K] over an input made in the kernel (``PRE``
    of ``_gemv``); returns (y, the residual stream written when ``pre`` is 2 with a
    residual)."""
    m, n, k = x.shape[0], w.shape[0], w.shape[1]
    if m > MAX_ROWS:
        raise ValueError(f"gemv serves at most {MAX_ROWS} rows, got {m}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("rows of x and w must be contiguous")
    if m == 1 and early():
        done = gemv_early(x, w, bias, pre=pre, residual=residual, norm_w=norm_w, eps=eps)
        if done is not None:
            return done
    bn, bk, split, warps, stages = launch("float", n, k)
    bm = triton.next_power_of_2(m)
    bn = max(2, bn // bm)
    split = _split(split, n, bn, bm)
    part, cnt = _workspace(x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    has_res = residual is not None
    res = residual if has_res else x
    res_out = torch.empty((m, k), dtype=x.dtype, device=x.device) if has_res else y
    _gemv[(triton.cdiv(n, bn), split)](
        x, y, w, y, bias if bias is not None else y, y, part, cnt, m, n, k, x.stride(0),
        w.stride(0), 0, y.stride(0), split, res, norm_w if norm_w is not None else y, res_out,
        eps, res.stride(0), res_out.stride(0), CODES=0, ACT=0, W_BLOCK_N=0, FP8=0, QMAX=1.0,
        MANT=0, EMIN=0, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        SPLIT=split > 1, AMAX_BLOCK=16, PRE=pre,
        HAS_RES=has_res, num_warps=warps, num_stages=stages, **launch_options(x.device))
    return y, (res_out if has_res else None)


def gemv_silu(gate_up: torch.Tensor, w: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` (``gate_up`` [M, 2K], as ``fused_triton.silu_and_mul`` rounds it)
    times W^T for float ``w`` [N, K], in one kernel."""
    if gate_up.shape[1] != 2 * w.shape[1]:
        raise ValueError(f"gate/up rows of {gate_up.shape[1]} columns for a weight of "
                         f"{w.shape[1]} inputs")
    return _gemv_pre(gate_up, w, bias, 1)[0]


def gemv_norm(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, eps: float,
              w: torch.Tensor, bias: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(``rms_norm(x + residual) * norm_w`` times W^T, ``x + residual``), as
    ``fused_triton.add_rms_norm`` followed by :func:`gemv`, in one kernel (without a
    residual: the norm of ``x``, and ``x``)."""
    y, res_out = _gemv_pre(x, w, bias, 2, residual, norm_w, eps)
    return y, (res_out if res_out is not None else x)


def gemv_affine(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias_: torch.Tensor,
                bits: int, group: int, sub: int, perm: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, round_weights: bool = False,
                config: tuple | None = None) -> torch.Tensor:
    """:func:`engine.runtime.quant_triton.affine_mm` for at most :data:`MAX_ROWS` rows. The
    dequantized weights multiply in float32 as they are (``round_weights``: rounded to x's
    dtype first, as the dense copy and ``affine_mm`` do; each weight on its own, by
    ``_gemv_affine_ref``). ``config``: as :data:`AFFINE_CONFIGS`'s entries."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"gemv serves at most {MAX_ROWS} rows, got {m}")
    n = q.shape[0]
    bn, split, warps, stages, tiles, factor_rows, subnormal = (config or
                                                            AFFINE_CONFIGS[shape_class(n, k)])
    bm = triton.next_power_of_2(m)
    ref = round_weights or tiles == 0
    if ref:
        bn = max(2, bn // bm)  # launches are chosen for one row: the same registers for more
    else:
        if tiles & (tiles - 1):
            raise ValueError(f"tiles per iteration must be a power of two, got {tiles}")
        # the scales' [BLOCK_N, TILES] and x's [TILES, SUB] loads stay below the program's
        # lanes (see _x_rows): BLOCK_N first, then TILES
        lanes = 32 * warps
        bn = min(bn, lanes // 2)
        while tiles > 1 and max(bn, sub) * tiles >= lanes:
            tiles //= 2
    split = _split(split, n, bn, bm)
    part, cnt = _workspace(x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    args = (x, q, scale, bias_, perm if perm is not None else q, bias if bias is not None else y,
            y, part, cnt, m, n, k, x.stride(0), q.stride(0), y.stride(0), split)
    common = dict(BITS=bits, GROUP=group, SUB=sub, HAS_PERM=perm is not None,
                  HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, SPLIT=split > 1,
                  num_warps=warps, num_stages=stages)
    grid = (triton.cdiv(n, bn), split)
    if ref:
        _gemv_affine_ref[grid](*args, ROUND=round_weights, **common)
    else:
        even = k % (32 // bits * sub * tiles) == 0 and n % bn == 0
        _gemv_affine[grid](*args, FACTOR=m <= factor_rows, SUBNORMAL=bool(subnormal),
                           TILES=tiles, PREFETCH=stages > 1, EVEN=even, **common,
                           **launch_options(x.device))
    return y
