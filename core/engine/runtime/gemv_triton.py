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
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.runtime.quant_triton import (_bits, _finish, _group_affine, _kind, _quantize,
                                         _row_scales, _slice, _split, _workspace, _x_slice,
                                         fp8_from_bits, shape_class)

#: largest row count these kernels serve (more rows: ``tl.dot`` kernels or cuBLAS)
MAX_ROWS = 4
#: rows up to which a dense half-precision layer on a GPU uses :func:`gemv` instead of cuBLAS
#: (``ENGINE_GEMV_DENSE_ROWS``; 0 by default: on an H200 one row is on par with cuBLAS, four
#: rows half its speed)
DENSE_ROWS = min(MAX_ROWS, int(os.environ.get("ENGINE_GEMV_DENSE_ROWS", "0")))


@triton.jit
def _gemv(x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
          stride_xm, stride_wn, stride_wsn, stride_ym, split_k,
          CODES: tl.constexpr, ACT: tl.constexpr, W_BLOCK_N: tl.constexpr, FP8: tl.constexpr,
          QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, HAS_BIAS: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          SPLIT: tl.constexpr, AMAX_BLOCK: tl.constexpr):
    """CODES 0: float weights; 1: 8-bit codes (FP8 0 int8, 1 e4m3, 2 e5m2) with per-row scales
    ``ws[n]`` (W_BLOCK_N 0) or block scales ``ws[n // W_BLOCK_N, k // BLOCK_K]``. ACT as in
    ``_w8_mm``: 0 unquantized, 1 dynamic per row, 2 per row and block (fp8), 3 static
    ``xs[0]``."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
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
    k_lo, k_hi = _slice(K, pid_k, split_k, BLOCK_K, SPLIT)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        if CODES == 1:
            w = fp8_from_bits(w, FP8)
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if ACT == 0:
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
def _gemv_affine(x_ptr, q_ptr, s_ptr, b_ptr, perm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
                 M, N, K, stride_xm, stride_qn, stride_ym, split_k,
                 BITS: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
                 HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, ROUND: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    """Per tile of SUB words (32/BITS slices of SUB columns, each inside one group): the codes
    become floats exactly (or'ed into the mantissa of 2^23, which is then subtracted), times
    the group's scale plus its bias (rounded to x's dtype when ROUND, as the dense copy is),
    times x."""
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
#: (BLOCK_N, SPLIT_K, warps, stages) for affine weights by shape class
AFFINE_CONFIGS = {"square": (32, 4, 2, 2), "wide": (32, 4, 2, 2), "deep": (32, 4, 4, 2)}


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
    kind = "block" if block is not None else "w8" if codes else "float"
    bn, bk, split, warps, stages = config or CONFIGS[(kind, shape_class(n, k))]
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
                CODES=int(codes), ACT=code, W_BLOCK_N=block[0] if block else 0, FP8=fp8,
                QMAX=qmax, MANT=mant, EMIN=emin, HAS_BIAS=bias is not None, BLOCK_M=bm,
                BLOCK_N=bn, BLOCK_K=bk, SPLIT=split > 1,
                AMAX_BLOCK=min(1024, triton.next_power_of_2(k)), num_warps=warps,
                num_stages=stages)
    return y


def gemv_affine(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias_: torch.Tensor,
                bits: int, group: int, sub: int, perm: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, round_weights: bool = False,
                config: tuple | None = None) -> torch.Tensor:
    """:func:`engine.runtime.quant_triton.affine_mm` for at most :data:`MAX_ROWS` rows. The
    dequantized weights multiply in float32 as they are (``round_weights``: rounded to x's
    dtype first, as the dense copy and ``affine_mm`` do; two conversions per weight)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"gemv serves at most {MAX_ROWS} rows, got {m}")
    n = q.shape[0]
    bn, split, warps, stages = config or AFFINE_CONFIGS[shape_class(n, k)]
    bm = triton.next_power_of_2(m)
    bn = max(2, bn // bm)
    split = _split(split, n, bn, bm)
    part, cnt = _workspace(x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _gemv_affine[(triton.cdiv(n, bn), split)](
        x, q, scale, bias_, perm if perm is not None else q, bias if bias is not None else y, y,
        part, cnt, m, n, k, x.stride(0), q.stride(0), y.stride(0), split, BITS=bits, GROUP=group,
        SUB=sub, HAS_PERM=perm is not None, HAS_BIAS=bias is not None, ROUND=round_weights,
        BLOCK_M=bm, BLOCK_N=bn, SPLIT=split > 1, num_warps=warps, num_stages=stages)
    return y
