"""One row of 8-bit codes (fp8 or int8, per-output scales) times the weights, its codes widened
by integer operations, in Triton.

At one row an 8-bit linear layer costs the time to read its codes once. The dense one-row
product (:func:`engine.runtime.gemv_triton.gemv_early`) reaches the copy rate because each
program loads all of its weights before it waits for the previous kernel (PDL). Codes loaded
that way must still become floats after the wait, and the hardware's conversions (fp8 to
half, half to float32; int8 to float32) issue at a quarter of the FMA rate: too slow to keep
up with the loads. Here no conversion instruction runs. Each program loads its codes as int32
words (four codes a word) before the wait; after it, code ``j`` of every word becomes a
float32 by two or three integer operations (:func:`_widen`):

- e4m3 (e5m2): the code moved to the top byte, shifted right by 4 (3) as a signed integer so
  that the sign fills the bits above the exponent, which a mask then clears. The code's 7
  bits land in the float32's low exponent and high mantissa bits: the float32 holds the
  code's value times 2^-120 (2^-112). Subnormal codes land on float32 subnormals, exactly
  (the kernels keep denormals); the powers of two move into the row's scale.
- int8 times unquantized activations: the code's byte, its sign bit flipped, ORed into the
  bits of 2^23 (the float32 of 2^23 + 128 + code), minus 2^23 + 128. Times int8 activation
  codes: the code moved to the top byte and shifted back as a signed integer, and the sums
  taken in int32 (exact, as the tensor-core kernels' are).

The activations (one row, unquantized, or quantized to the weights' type per row, dynamic or
static, exactly as :func:`engine.runtime.quant_triton.w8_mm` quantizes them) are read for
columns ``4c + j``, the codes' order in the words, and multiplied in float32 (fp8 activation
codes times 2^64, so that no product of two small codes is a float32 subnormal). The sums
then take the row's and the outputs' scales, as ``w8_mm``'s do. Products of codes are exact in
float32; only the order of the sums differs from the tensor-core kernels.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.runtime.quant_triton import (_finish, _kind, _quantize, _row1_scale, _split,
                                         _workspace, shape_class)
from engine.runtime.triton_pdl import launch_options, pdl_enabled, pdl_trigger, pdl_wait

#: masks of the widened fp8 codes as signed int32: the sign bit and the 7 bits below the top
#: nibble (e4m3: bits 26-20) or top three bits (e5m2: bits 27-21)
_E4M3_MASK = tl.constexpr(-0x78100000)   # 0x87F00000
_E5M2_MASK = tl.constexpr(-0x70200000)   # 0x8FE00000
#: int8 codes: the bits of 2^23 with the code's sign bit set (its sign flipped by the XOR)
_INT8_MAGIC = tl.constexpr(0x4B000080)
#: the fp8 activation codes' factor (2^64) and what is left of the widened codes' on the sums
X_FACTOR = 2.0 ** 64
SUM_FACTOR = {1: 2.0 ** (120 - 64), 2: 2.0 ** (112 - 64), 0: 1.0}


@triton.jit
def _widen(w, J: tl.constexpr, FP8: tl.constexpr, INT: tl.constexpr):
    """Code J (byte J, lowest first) of every int32 word of ``w``: as float32, e4m3's value
    times 2^-120, e5m2's times 2^-112, int8's exactly; as int32 when INT (int8 codes that
    multiply int8 activation codes: exact sums)."""
    if J == 3:
        top = w
    else:
        top = w << (24 - 8 * J)
    if INT:
        v = top >> 24
    elif FP8 == 0:
        b = (w >> (8 * J)) & 0xFF
        v = (b ^ _INT8_MAGIC).to(tl.float32, bitcast=True) - 8388736.0
    elif FP8 == 1:
        v = ((top >> 4) & _E4M3_MASK).to(tl.float32, bitcast=True)
    else:
        v = ((top >> 3) & _E5M2_MASK).to(tl.float32, bitcast=True)
    return v


@triton.jit
def _x_codes(x_ptr, c4, J: tl.constexpr, K, s1, r1, ACT: tl.constexpr, FP8: tl.constexpr,
             QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr):
    """The row's columns ``c4 + J`` as the factors of code J: unquantized (ACT 0) or quantized
    with the row's scale ``s1`` (reciprocal ``r1``); int8 codes as int32, fp8 values (codes
    or not) times 2^64."""
    x = tl.load(x_ptr + c4 + J, mask=c4 + J < K, other=0.0).to(tl.float32)
    if ACT != 0:
        x = _quantize(x, s1, r1, FP8, QMAX, MANT, EMIN)
    if ACT != 0 and FP8 == 0:
        v = x.to(tl.int32)
    elif FP8 != 0:
        v = x * 18446744073709551616.0  # 2^64: exact
    else:
        v = x
    return v


@triton.jit
def _w8_row(x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, N, K, KW,
            stride_wn, split_k, sum_factor, ACT: tl.constexpr, FP8: tl.constexpr,
            QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
            HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr,
            AMAX_BLOCK: tl.constexpr, AMAX_CHUNKS: tl.constexpr, SPLIT: tl.constexpr,
            PDL: tl.constexpr):
    """Program (n, k): outputs ``n * BLOCK_N ..`` over the WORDS words (4 * WORDS columns)
    from word ``k * WORDS`` on. ``w`` is int32 [N, KW] (stride_wn in words), ``ws`` the
    outputs' scales [N]. ACT 0: x unquantized; 1: quantized per row, dynamic (the scale from
    the whole row, read in AMAX_CHUNKS unrolled blocks, or a loop when 0); 3: static
    ``xs[0]``. The words are loaded before the wait for the previous kernel (PDL)."""
    pdl_trigger(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    c = pid_k * WORDS + tl.arange(0, WORDS)
    c_ok = c < KW
    w_rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * stride_wn
    w = tl.load(w_rows + c[None, :], mask=c_ok[None, :], other=0)
    ws = tl.load(ws_ptr + offs_n, mask=n_ok, other=0.0)
    pdl_wait(PDL)
    s1 = 1.0
    if ACT == 1:
        s1 = _row1_scale(x_ptr, K, QMAX, AMAX_BLOCK, AMAX_CHUNKS)
    elif ACT == 3:
        s1 = tl.load(xs_ptr)
    r1 = tl.math.div_rn(1.0, s1)
    c4 = c * 4
    INT: tl.constexpr = FP8 == 0 and ACT != 0
    acc = _widen(w, 0, FP8, INT) * _x_codes(x_ptr, c4, 0, K, s1, r1, ACT, FP8, QMAX, MANT,
                                            EMIN)[None, :]
    for j in tl.static_range(1, 4):
        xj = _x_codes(x_ptr, c4, j, K, s1, r1, ACT, FP8, QMAX, MANT, EMIN)
        acc += _widen(w, j, FP8, INT) * xj[None, :]
    row_s = tl.full((1, 1), 1.0, tl.float32) * sum_factor
    if ACT != 0:
        row_s = row_s * s1
    _finish(tl.sum(acc, axis=1)[None, :], row_s, ws[None, :], pid_n, pid_k, tl.arange(0, 1),
            offs_n, tl.full((1,), 1, tl.int1), n_ok, bias_ptr, y_ptr, part_ptr, cnt_ptr, N, 0,
            split_k, HAS_BIAS, 1, SPLIT)


#: the most blocks of 1,024 columns one row's dynamic scale is read in, unrolled (every load in
#: flight at once); longer rows loop
AMAX_UNROLL = 16
#: (BLOCK_N, columns a program, warps) by shape class; not yet chosen on an H200 (the dense
#: one-row form's launches with the same bytes a program: twice the columns of 16-bit weights)
CONFIGS = {"square": (8, 4096, 4), "wide": (8, 4096, 4), "deep": (4, 16384, 8)}


def enabled(device: torch.device) -> bool:
    """Whether one row of 8-bit codes with per-output scales goes to :func:`w8_row` on
    ``device`` (``ENGINE_W8_ROW=1``, an opt-in A/B until it is measured; the form pays only
    where the codes load before the wait: PDL GPUs)."""
    return os.environ.get("ENGINE_W8_ROW") == "1" and pdl_enabled(device)


def serves(x: torch.Tensor, w: torch.Tensor, block: tuple[int, int] | None,
           act: str | None) -> bool:
    """Whether :func:`w8_row` computes this product: one row, per-output scales, activations
    unquantized or per row, codes in whole int32 words (K a multiple of 4, rows contiguous
    and 4-byte aligned)."""
    k = w.shape[1]
    return (x.shape[0] == 1 and block is None and act in (None, "token", "static")
            and k % 4 == 0 and w.stride(-1) == 1 and w.stride(0) % 4 == 0
            and w.data_ptr() % 4 == 0 and w.dtype in (torch.int8, torch.float8_e4m3fn,
                                                       torch.float8_e5m2))


def w8_row(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, *, act: str | None = None,
           x_scale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
           bias: torch.Tensor | None = None, config: tuple | None = None) -> torch.Tensor:
    """``x`` [1, K] @ W^T for 8-bit ``w`` [N, K] with per-output scales ``w_scale`` [N], with
    :func:`engine.runtime.quant_triton.w8_mm`'s arguments and results (``act`` None, "token"
    or "static"; see :func:`serves`). ``config``: (BLOCK_N, columns a program, warps), else
    ``ENGINE_W8_ROW_CONFIG`` = "bn,kc,warps", else :data:`CONFIGS`."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    n, k = w.shape
    fp8, mant, emin, qmax = _kind(w.dtype)
    env = os.environ.get("ENGINE_W8_ROW_CONFIG")
    bn, kc, warps = config or (tuple(int(v) for v in env.split(",")) if env
                               else CONFIGS[shape_class(n, k)])
    words = max(16, triton.next_power_of_2(min(kc, k)) // 4)
    kw = k // 4
    split = _split(triton.cdiv(kw, words), n, bn, 1)
    if split > 1 and split != triton.cdiv(kw, words):  # the workspace cannot hold the slices
        words, split = triton.next_power_of_2(kw), 1
    code = {None: 0, "token": 1, "static": 3}[act]
    amax_block = min(1024, triton.next_power_of_2(k))
    chunks = triton.cdiv(k, amax_block)
    y = torch.empty((1, n), dtype=out_dtype or x.dtype, device=x.device)
    part, cnt = _workspace(x.device)
    w32 = w.view(torch.int32) if w.dtype == torch.int8 else w.view(torch.uint8).view(torch.int32)
    _w8_row[(triton.cdiv(n, bn), split)](
        x, x_scale if x_scale is not None else w_scale, w32, w_scale,
        bias if bias is not None else y, y, part, cnt, n, k, kw, w32.stride(0), split,
        SUM_FACTOR[fp8], ACT=code, FP8=fp8, QMAX=qmax, MANT=mant, EMIN=emin,
        HAS_BIAS=bias is not None, BLOCK_N=bn, WORDS=words, AMAX_BLOCK=amax_block,
        AMAX_CHUNKS=chunks if chunks <= AMAX_UNROLL else 0, SPLIT=split > 1, num_warps=warps,
        **launch_options(x.device))
    return y
