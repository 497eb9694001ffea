"""The Triton kernels behind :mod:`engine.runtime.fused`, imported only when a GPU tensor (or the
Triton interpreter) needs them: a CPU server never loads Triton (~0.1 s and ~70 MiB)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runtime.linear import GroupCodes
from engine.runtime.quant_triton import (_bits, _codes, _kind, _quantize, _signed,
                                         _store_group_codes, group_code_buffers)
from engine.runtime.triton_pdl import launch_options, pdl_trigger, pdl_wait
from engine.runtime.triton_pdl import (l2_prefetch,  # noqa: F401  (the models' entry)
                                      l2_prefetch_enabled)


@triton.jit
def _round(x, dtype: tl.constexpr):
    return x.to(dtype).to(tl.float32)


@triton.jit
def _norm_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, n, stride_x, stride_r, stride_ro, eps,
              HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One row's ``rms_norm(x + res) * w`` [BLOCK] in float32 (to be rounded to x's dtype;
    masked lanes 0), the sum ``x + res`` stored; both norm kernels' arithmetic, so that they
    agree bit for bit."""
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    dt = x_ptr.dtype.element_ty
    pdl_trigger(PDL)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=ok, other=0.0).to(tl.float32)
        x = _round(x + r, dt)
        tl.store(res_out_ptr + row * stride_ro + offs, x.to(dt), mask=ok)
    var = tl.sum(x * x, axis=0) / n
    rstd = 1.0 / tl.sqrt(var + eps)
    return _round(x * rstd, dt) * w


@triton.jit
def _add_rms_norm(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n, stride_x, stride_r,
                  stride_o, stride_ro, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    y = _norm_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, n, stride_x, stride_r, stride_ro,
                  eps, HAS_RES, BLOCK, PDL)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _add_rms_norm_groups(x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, n, M, stride_x,
                         stride_r, stride_q, stride_ro, eps, HAS_RES: tl.constexpr,
                         BLOCK: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr,
                         QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                         GRID: tl.constexpr, PDL: tl.constexpr):
    """:func:`_add_rms_norm` writing the normed row as fp8 codes per group of GROUP columns
    and their scales ([n / GROUP, M]) instead of the row: what ``quant_groups`` makes of the
    row the other kernel stores."""
    row = tl.program_id(0).to(tl.int64)
    y = _norm_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, n, stride_x, stride_r, stride_ro,
                  eps, HAS_RES, BLOCK, PDL)
    y = tl.reshape(_round(y, x_ptr.dtype.element_ty), (BLOCK // GROUP, GROUP))
    g = tl.arange(0, BLOCK // GROUP)[:, None]
    col = g * GROUP + tl.arange(0, GROUP)[None, :]
    _store_group_codes(y, q_ptr + row * stride_q + col, col < n, s_ptr + g * M + row,
                       g * GROUP < n, FP8, QMAX, MANT, EMIN, GRID)


@triton.jit
def _qk_norm_rope(src_ptr, q_out_ptr, k_out_ptr, v_out_ptr, loc_ptr, qw_ptr, kw_ptr, cos_ptr,
                  sin_ptr, pos_ptr, stride_src, stride_cache, hq, hkv, eps, k_scale, v_scale,
                  HALF: tl.constexpr, HEADS: tl.constexpr, NORM: tl.constexpr,
                  STORE: tl.constexpr, FP8: tl.constexpr, QMAX: tl.constexpr,
                  MANT: tl.constexpr, EMIN: tl.constexpr, PDL: tl.constexpr):
    """Program (t, g): heads ``g * HEADS ..`` of token t's qkv row (q heads, then k heads, then
    (STORE only) v heads), the token's cos/sin loaded once for them. q/k are normed (NORM) and
    rotated; with STORE, k and v go straight into the KV pool's rows ``loc[t]`` ([slots, hkv,
    D] each), else k into k_out [T, hkv, D]. With FP8 (1: e4m3, 2: e5m2) the pool holds fp8
    bytes: k and v, rounded to q's dtype as they would be stored, are divided by the layer's
    ``k_scale`` / ``v_scale``, saturated and rounded to the fp8 grid exactly as
    ``KVPool.write`` does. Every head's arithmetic is the same whatever HEADS is (one head a
    program for a few tokens, several for a prefill's thousands)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)[:, None]  # [HEADS, 1]
    dt = q_out_ptr.dtype.element_ty
    offs = tl.arange(0, HALF)[None, :]
    n_heads = hq + (2 * hkv if STORE else hkv)
    ok = h < n_heads
    is_q = h < hq
    is_k = (h >= hq) & (h < hq + hkv)
    pdl_trigger(PDL)
    # before the wait: the positions and cache rows (written before the step's first kernel),
    # the cos/sin tables and the norm weights (constants)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    c1 = _round(tl.load(cos_ptr + pos * stride_cache + offs), dt)
    c2 = _round(tl.load(cos_ptr + pos * stride_cache + HALF + offs), dt)
    s1 = _round(tl.load(sin_ptr + pos * stride_cache + offs), dt)  # -sin (sin_signed)
    s2 = _round(tl.load(sin_ptr + pos * stride_cache + HALF + offs), dt)
    if NORM:
        w1 = tl.where(is_q, tl.load(qw_ptr + offs), tl.load(kw_ptr + offs)).to(tl.float32)
        w2 = tl.where(is_q, tl.load(qw_ptr + HALF + offs),
                      tl.load(kw_ptr + HALF + offs)).to(tl.float32)
    if STORE:
        row = tl.load(loc_ptr + t).to(tl.int64)
    pdl_wait(PDL)
    base = src_ptr + t * stride_src + h * (2 * HALF)  # q heads, then k, then v, in the row
    x1 = tl.load(base + offs, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    rotate = is_q | is_k  # q or k: (norm and) rotate; v is stored as it is
    if NORM:
        var = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1))[:, None] / (2 * HALF)
        rstd = 1.0 / tl.sqrt(var + eps)
        n1 = _round(_round(x1 * rstd, dt) * w1, dt)
        n2 = _round(_round(x2 * rstd, dt) * w2, dt)
    else:
        n1 = x1
        n2 = x2
    y1 = tl.where(rotate, _round(_round(n1 * c1, dt) + _round(n2 * s1, dt), dt), x1)
    y2 = tl.where(rotate, _round(_round(n2 * c2, dt) + _round(n1 * s2, dt), dt), x2)
    if STORE:
        kv = tl.where(is_k, k_out_ptr + (row * hkv + (h - hq)) * (2 * HALF),
                      v_out_ptr + (row * hkv + (h - hq - hkv)) * (2 * HALF))
    else:
        kv = k_out_ptr + (t * hkv + (h - hq)) * (2 * HALF)
    if FP8 != 0:  # q as it is, k/v as the pool's fp8 bytes
        dst = q_out_ptr + (t * hq + h) * (2 * HALF)
        tl.store(dst + offs, y1.to(dt), mask=ok & is_q)
        tl.store(dst + HALF + offs, y2.to(dt), mask=ok & is_q)
        s = tl.where(is_k, k_scale, v_scale)
        r = tl.math.div_rn(1.0, s)
        on_pool = ok & (h >= hq)
        c1 = _codes(_signed(_quantize(y1.to(dt).to(tl.float32), s, r, FP8, QMAX, MANT, EMIN),
                            y1), FP8)
        c2 = _codes(_signed(_quantize(y2.to(dt).to(tl.float32), s, r, FP8, QMAX, MANT, EMIN),
                            y2), FP8)
        tl.store(kv + offs, c1.to(tl.uint8, bitcast=True), mask=on_pool)
        tl.store(kv + HALF + offs, c2.to(tl.uint8, bitcast=True), mask=on_pool)
    else:
        dst = tl.where(is_q, q_out_ptr + (t * hq + h) * (2 * HALF), kv)
        tl.store(dst + offs, y1.to(dt), mask=ok)
        tl.store(dst + HALF + offs, y2.to(dt), mask=ok)


def _head_launch(tokens: int, heads: int, head_dim: int) -> tuple[int, int, int]:
    """(heads a program, programs a token, warps) of :func:`_qk_norm_rope`: one head a program
    for a few tokens (a decode step: the most programs in flight), eight for more (a prefill's
    programs are then ~6 a token, not ~50 of one warp each, whose scheduling set its pace)."""
    per = 1 if tokens <= 32 else min(8, triton.next_power_of_2(heads))
    warps = 1 if per == 1 else 4
    if head_dim > 128:
        warps *= 2
    return per, triton.cdiv(heads, per), warps


@triton.jit
def _silu_mul(x_ptr, row, stride_x, inter, cols, ok, PDL: tl.constexpr):
    """``silu(gate) * up`` at columns ``cols`` of one row of ``x`` [T, 2 * inter], in float32
    (to be rounded to x's dtype); both SiLU-and-mul kernels' arithmetic."""
    dt = x_ptr.dtype.element_ty
    pdl_trigger(PDL)
    pdl_wait(PDL)
    g = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + inter + cols, mask=ok, other=0.0).to(tl.float32)
    return _round(g * tl.sigmoid(g), dt) * u  # silu(gate) is rounded before the product


@triton.jit
def _silu_and_mul(x_ptr, out_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    act = _silu_mul(x_ptr, row, stride_x, inter, offs, ok, PDL)
    tl.store(out_ptr + row * stride_o + offs, act.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _silu_and_mul_groups(x_ptr, q_ptr, s_ptr, inter, M, stride_x, stride_q,
                         BLOCK: tl.constexpr, GROUP: tl.constexpr, FP8: tl.constexpr,
                         QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                         GRID: tl.constexpr, PDL: tl.constexpr):
    """:func:`_silu_and_mul` writing its BLOCK columns as fp8 codes per group of GROUP
    columns and their scales ([inter / GROUP, M]), as ``quant_groups`` makes them of the row
    the other kernel stores."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * (BLOCK // GROUP) + tl.arange(0, BLOCK // GROUP)[:, None]
    col = g * GROUP + tl.arange(0, GROUP)[None, :]
    ok = col < inter
    act = _round(_silu_mul(x_ptr, row, stride_x, inter, col, ok, PDL),
                 x_ptr.dtype.element_ty)
    _store_group_codes(act, q_ptr + row * stride_q + col, ok, s_ptr + g * M + row,
                       g * GROUP < inter, FP8, QMAX, MANT, EMIN, GRID)


@triton.jit
def _route_topk(logits_ptr, w_ptr, ids_ptr, E, stride_l, K: tl.constexpr,
                RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                PDL: tl.constexpr):
    """k passes, each the maximum of one int64 key a probability: its float bits above (the
    probabilities are >= 0, so their bits order as integers), ``BLOCK_E - 1 - id`` below (a
    tie goes to the lower id, as ``torch.topk``), a warp reduction of the two halves rather
    than a maximum and then the lowest id holding it. The k weights and ids stay in registers
    (``BLOCK_K``: k rounded up to a power of two) until one store each."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    ok = offs < E
    pdl_trigger(PDL)
    pdl_wait(PDL)
    x = tl.load(logits_ptr + t * stride_l + offs, mask=ok, other=-float("inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - offs)
    key = tl.where(ok, key, -1)
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros((BLOCK_K,), dtype=tl.float32)
    ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
    total = 0.0
    for i in tl.static_range(K):
        best = tl.max(key, axis=0)
        idx = BLOCK_E - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        w = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        weights = tl.where(slots == i, w, weights)
        ids = tl.where(slots == i, idx, ids)
        total += w
        key = tl.where(offs == idx, -1, key)
    if RENORM:
        weights = weights / total
    tl.store(w_ptr + t * K + slots, weights, mask=slots < K)
    tl.store(ids_ptr + t * K + slots, ids, mask=slots < K)


def route_topk(logits: torch.Tensor, top_k: int,
               renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over each row of router ``logits`` [T, E] in float32, its top-k (descending) and,
    with ``renormalize``, the k weights divided by their sum: (weights float32 [T, k], ids int32
    [T, k]) in one kernel."""
    t, e = logits.shape
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    if t:
        _route_topk[(t,)](logits, weights, ids, e, logits.stride(0), K=top_k,
                          RENORM=renormalize, BLOCK_E=triton.next_power_of_2(e),
                          BLOCK_K=triton.next_power_of_2(top_k),
                          num_warps=1 if e <= 256 else 4, **launch_options(logits.device))
    return weights, ids


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual) for rows of ``x`` [T, N]; without a
    residual, (rms_norm(x) * weight, x)."""
    t, n = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    res = residual if residual is not None else x
    _add_rms_norm[(t,)](x, res, weight, out, res_out, n, x.stride(0), res.stride(0),
                        out.stride(0), res_out.stride(0), eps, HAS_RES=residual is not None,
                        BLOCK=triton.next_power_of_2(n), num_warps=4 if n <= 4096 else 8,
                        **launch_options(x.device))
    return out, res_out


def add_rms_norm_groups(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                        eps: float, dtype: torch.dtype,
                        group: int) -> tuple[GroupCodes, torch.Tensor]:
    """(:func:`add_rms_norm`'s normed rows as ``dtype`` (fp8) codes per row and group of
    ``group`` columns, x + residual): the codes and scales ``quant_triton.quant_groups`` makes
    of the rows :func:`add_rms_norm` returns, bit for bit, in one kernel."""
    t, n = x.shape
    codes, scales, fmt = group_code_buffers(t, n, dtype, group, x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    res = residual if residual is not None else x
    _add_rms_norm_groups[(t,)](x, res, weight, _bits(codes), scales, res_out, n, t, x.stride(0),
                               res.stride(0), codes.stride(0), res_out.stride(0), eps,
                               HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n),
                               GROUP=group, num_warps=4 if n <= 4096 else 8, **fmt,
                               **launch_options(x.device))
    return GroupCodes(codes, scales.t(), group, x.dtype), res_out


def qk_norm_rope(qk: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D] and k [T, Hkv, D] from the q and k columns at the start of each row of
    ``qk`` (the fused qkv projection), each head RMS-normalised with its weight (when given) and
    rotated by RoPE at ``positions`` (caches as :class:`engine.models.llama.Rotary` keeps them:
    float32 [max_pos, D], ``sin`` with its first half negated)."""
    t = qk.shape[0]
    q = torch.empty(t, num_q_heads, head_dim, dtype=qk.dtype, device=qk.device)
    k = torch.empty(t, num_kv_heads, head_dim, dtype=qk.dtype, device=qk.device)
    if t == 0:
        return q, k
    norm = q_weight is not None
    per, groups, warps = _head_launch(t, num_q_heads + num_kv_heads, head_dim)
    _qk_norm_rope[(t, groups)](
        qk, q, k, k, positions, q_weight if norm else qk, k_weight if norm else qk, cos_cache,
        sin_cache, positions, qk.stride(0), cos_cache.stride(0), num_q_heads, num_kv_heads, eps,
        1.0, 1.0, HALF=head_dim // 2, HEADS=per, NORM=norm, STORE=False, FP8=0, QMAX=0.0,
        MANT=0, EMIN=0, num_warps=warps, **launch_options(qk.device))
    return q, k


def qk_norm_rope_store(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
                       positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                       q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                       k_pool: torch.Tensor, v_pool: torch.Tensor, out_loc: torch.Tensor,
                       k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """:func:`qk_norm_rope` that also writes the KV cache: k (normed, rotated) and v of token t
    go straight into rows ``out_loc[t]`` of ``k_pool``/``v_pool`` ([slots, Hkv, D]: ``qkv``'s
    dtype, or fp8 with the layer's ``k_scale``/``v_scale``), as ``KVPool.write`` would, in
    the same kernel. Returns q."""
    t = qkv.shape[0]
    q = torch.empty(t, num_q_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    norm = q_weight is not None
    per, groups, warps = _head_launch(t, num_q_heads + 2 * num_kv_heads, head_dim)
    fp8, mant, emin, qmax = (_kind(k_pool.dtype) if k_pool.dtype != qkv.dtype
                             else (0, 0, 0, 0.0))
    _qk_norm_rope[(t, groups)](
        qkv, q, _bits(k_pool), _bits(v_pool), out_loc, q_weight if norm else qkv,
        k_weight if norm else qkv, cos_cache, sin_cache, positions, qkv.stride(0),
        cos_cache.stride(0), num_q_heads, num_kv_heads, eps, float(k_scale), float(v_scale),
        HALF=head_dim // 2, HEADS=per, NORM=norm, STORE=True, FP8=fp8, QMAX=qmax, MANT=mant,
        EMIN=emin, num_warps=warps, **launch_options(qkv.device))
    return q


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x`` [T, 2I]."""
    t, two_i = x.shape
    inter = two_i // 2
    out = torch.empty(t, inter, dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(inter))
    if t:
        _silu_and_mul[(t, triton.cdiv(inter, block))](x, out, inter, x.stride(0), out.stride(0),
                                                      BLOCK=block, **launch_options(x.device))
    return out


def silu_and_mul_groups(x: torch.Tensor, dtype: torch.dtype, group: int) -> GroupCodes:
    """:func:`silu_and_mul`'s rows as ``dtype`` (fp8) codes per row and group of ``group``
    columns: the codes and scales ``quant_triton.quant_groups`` makes of them, bit for bit, in
    one kernel."""
    t, two_i = x.shape
    inter = two_i // 2
    codes, scales, fmt = group_code_buffers(t, inter, dtype, group, x.device)
    block = max(group, min(1024, triton.next_power_of_2(inter)))
    if t:
        _silu_and_mul_groups[(t, triton.cdiv(inter, block))](
            x, _bits(codes), scales, inter, t, x.stride(0), codes.stride(0), BLOCK=block,
            GROUP=group, **fmt, **launch_options(x.device))
    return GroupCodes(codes, scales.t(), group, x.dtype)


@triton.jit
def _copy_rows(src_table, dst_table, src_idx, dst_idx, n, words, step,
               ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Program (p, j): rows ``src_idx[r]`` of tensor ``j`` of ``src_table`` (a table of base
    addresses) to rows ``dst_idx[r]`` of tensor ``j`` of ``dst_table``, for the blocks of
    ``ROWS`` rows ``r`` starting at ``p * ROWS``, every ``step`` rows; rows of ``words`` 32-bit
    words. Either side may be pinned host memory, which the GPU reads and writes in place."""
    p = tl.program_id(0)
    j = tl.program_id(1)
    src = tl.load(src_table + j).to(tl.pointer_type(tl.int32))
    dst = tl.load(dst_table + j).to(tl.pointer_type(tl.int32))
    for r0 in range(p * ROWS, n, step):
        rows = r0 + tl.arange(0, ROWS)
        r_ok = rows < n
        s = tl.load(src_idx + rows, mask=r_ok, other=0).to(tl.int64)[:, None] * words
        d = tl.load(dst_idx + rows, mask=r_ok, other=0).to(tl.int64)[:, None] * words
        for w0 in range(0, words, BLOCK):
            offs = w0 + tl.arange(0, BLOCK)[None, :]
            ok = r_ok[:, None] & (offs < words)
            tl.store(dst + d + offs, tl.load(src + s + offs, mask=ok), mask=ok)


def copy_rows(src_table: torch.Tensor, dst_table: torch.Tensor, src_idx: torch.Tensor,
              dst_idx: torch.Tensor, row_bytes: int, programs: int | None = None) -> None:
    """For each tensor ``j`` of the two tables (int64 base addresses, on the device) copy rows
    ``src_idx`` of source ``j`` to rows ``dst_idx`` of destination ``j`` (``row_bytes`` a
    multiple of 4); one launch for every tensor, e.g. each layer's K and V of a KV pool.
    ``programs``: at most that many programs per tensor, each looping over its share of the
    rows (a copy that runs beside a forward leaves it the rest of the multiprocessors); None:
    one program per few rows."""
    if row_bytes % 4:
        raise ValueError(f"rows of {row_bytes} bytes are not whole 32-bit words")
    n, words = src_idx.numel(), row_bytes // 4
    if n:
        block = min(1024, triton.next_power_of_2(words))
        rows = max(1, min(8, 2048 // block))  # ~8 KB in flight per program and pass
        p = triton.cdiv(n, rows) if programs is None else min(programs, triton.cdiv(n, rows))
        _copy_rows[(p, src_table.numel())](src_table, dst_table, src_idx, dst_idx, n, words,
                                           p * rows, ROWS=rows, BLOCK=block)
