"""Triton products of quantized weights that stay packed on the GPU.

A decode step reads every weight once, so a 4-bit weight is a quarter of the bf16 bytes and an
fp8 or int8 weight half, but only if the product reads the packed codes itself. Two kernels:

- :func:`affine_mm`: weight-only integer formats (GPTQ, AWQ, compressed-tensors pack-quantized
  and int weight-only, MLX, auto-round) in one canonical form, ``W[n, k] = q[n, k] * scale[g, n]
  + bias[g, n]`` (``g = k // group``) with unsigned 2-, 4- or 8-bit codes ``q``, packed by
  :func:`pack_affine` so that one int32 word holds the codes of ``k = t*PACK + j*SUB + i`` for
  ``j`` in ``0..32/bits-1``: a tile of ``SUB`` words unpacks, one shift per ``j``, into
  ``32/bits`` slices of ``SUB`` consecutive columns, each inside one group. An optional
  permutation of K serves act-order checkpoints (their groups made contiguous). The
  dequantized weight is rounded to the activation dtype before the product, as the dense copy
  would be.
- :func:`w8_mm`: fp8 and int8 weights ``[N, K]`` with per-output-row scales or block scales
  ``[N/bn, K/bk]``; activations unquantized (W8A16), quantized per row (dynamic: the row's
  absolute maximum; or a static scale), or per row and block of ``bk`` columns (block fp8).
  Activation codes are computed as the torch quantizers compute them (correctly rounded
  division, round to nearest even, saturation), so int8 products are bit-exact against
  ``torch._int_mm`` and fp8 pairs multiply exactly in float32.

Up to :data:`GEMV_ROWS` rows (decode at small batch) :func:`affine_mm` hands over to the
matrix-vector kernel of :mod:`engine.runtime.gemv_triton` (or, for the code widths and rows
:data:`AFFINE_SWAP` lists, to the swapped-operand kernel of :mod:`engine.runtime.swap_affine`;
from :data:`DEQUANT_ROWS` rows it writes the weight into a temporary for cuBLAS,
:func:`dequant_affine`), and :func:`w8_mm` to it or to its own ``tl.dot`` kernel with the rows
padded to 16 (whichever :data:`W8_SMALL` names; fp8 codes multiply on the tensor cores without
conversion). Otherwise both are one program per ``BLOCK_N`` outputs and ``BLOCK_M`` rows,
products through ``tl.dot``. With ``split_k > 1`` (one block of rows) each of that many programs
per output block takes a slice of K, and :func:`_finish` adds the slices up in the same launch
(an atomic counter per output block: the last slice to arrive sums the partials). fp8 rounding
is float32 arithmetic (round to nearest even on the format's grid), so the Triton interpreter
computes the same codes as the GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.runtime.triton_pdl import launch_options, pdl_trigger, pdl_wait

#: largest row count handed to the matrix-vector kernels of :mod:`engine.runtime.gemv_triton`
#: (0: none)
GEMV_ROWS = 4
#: largest row count handed to the swapped-operand kernel of :mod:`engine.runtime.swap_triton`
#: where its table serves the weights (:func:`engine.runtime.swap_triton.small_config`). On an
#: H200 (Llama-3-8B's linear layers, a step's worth) at 17 / 32 / 64 rows: fp8 row-wise 0.71 /
#: 0.69 / 0.77x of bf16 and int8 0.72 / 0.70 / 0.77x through it, against 1.17 / 1.10 / 1.04x
#: (cuBLAS row-wise fp8) and 1.58 / 1.18 / 1.27x (the ``tl.dot`` kernel);
#: ``ENGINE_SWAP_ROWS`` sets another, for A/B runs (the kernel serves up to 128)
SWAP_ROWS = min(128, int(os.environ.get("ENGINE_SWAP_ROWS", "64")))
#: rows (first, last) that :func:`affine_mm` hands to the swapped-operand kernel of
#: :mod:`engine.runtime.swap_affine`, by code width. An H200 measured
#: (``benchmarks/swap_affine_gpu.py``, Llama-3-8B's layers, int4 in groups of 128, a step's
#: linear layers, 2026-12-03): swapped 2.14 / 2.35 / 2.71 / 4.30 / 7.78 ms at 1 / 16 / 32 / 64 /
#: 128 rows; the gemv 2.13 at 1 row (4.65 at 4); ``tl.dot`` 21.96 at 16; dequantize + cuBLAS
#: 9.89 at 128, 11.05 at 256 (swapped: 19.97); dense bf16 3.82-4.36. Widths not listed keep
#: the gemv and ``tl.dot`` kernels. One row since its launches with the groups in the
#: product's columns (an H100, 2026-12-06: the step's 4-bit products 2.21-2.25 ms against the
#: gemv's 2.30-2.40); ``ENGINE_AFFINE_SWAP_FIRST=2`` gives one row to the gemv (A/B runs).
AFFINE_SWAP = {4: (int(os.environ.get("ENGINE_AFFINE_SWAP_FIRST", "1")), 128)}
#: weights [n, k] whose one row stays on the gemv although :data:`AFFINE_SWAP` takes one row,
#: by code width: where the swapped launch's programs fill less than a wave (an H100,
#: 2026-12-06, ``benchmarks/int4pack_gpu.py --rows 1``, us a layer, swapped / gemv: o 9.1 /
#: 7.4, down 18.9 / 18.6; q/k/v 9.8 / 11.6 and gate/up 32.2 / 34.4 stay swapped);
#: ``ENGINE_AFFINE_ONE_ROW_GEMV=0`` takes none
AFFINE_ONE_ROW_GEMV = ({} if os.environ.get("ENGINE_AFFINE_ONE_ROW_GEMV") == "0"
                       else {4: {(4096, 4096), (4096, 14336)}})
#: one row of 4-bit codes through :func:`engine.runtime.affine_mma.affine_mma` (the matrix
#: unit's synchronous instruction with both operands in registers) where it serves the product
#: (``ENGINE_AFFINE_MMA=1``; off by default: on an H100 the gptq/awq step took 2.46-2.50 ms
#: through it against 2.24-2.29 through the swapped kernel and the gemv)
AFFINE_MMA = os.environ.get("ENGINE_AFFINE_MMA", "0") == "1"


def launch_spec(spec: str, env: str, form: str, key, sep: str = ":") -> dict:
    """A launch table given in an environment variable: ``"KEY<sep>v,v,...;..."`` ->
    {key(KEY): (v, ...)} (integers); an entry that does not parse raises a ValueError naming
    ``env`` and the expected ``form``."""
    table = {}
    for item in filter(None, spec.split(";")):
        name, _, launch = item.partition(sep)
        try:
            table[key(name.strip())] = tuple(int(v) for v in launch.split(",") if v)
        except ValueError:
            raise ValueError(f"{env}: {item!r} is not {form}") from None
    return table


def _shape(name: str) -> tuple[int, int]:
    n, k = (int(v) for v in name.split("x"))
    return n, k


def _mma_route(spec: str) -> dict[tuple[int, int], tuple[int, ...]]:
    """``"NxK:MR,warps,CT,split,D,XA,CG,S;..."`` -> {(N, K): config}."""
    return launch_spec(spec, "ENGINE_AFFINE_MMA_ROUTE", "NxK:MR,warps,CT,split[,D,XA,CG,S]",
                       _shape)


#: weights [n, k] whose one row of 4-bit codes goes to
#: :func:`engine.runtime.affine_mma.affine_mma` with the launch config given, whatever
#: :data:`AFFINE_MMA` says (``ENGINE_AFFINE_MMA_ROUTE="28672x4096:1,4,4,1,1,1,1,4"``: the
#: fused gate/up weight through 4 stages of shared memory; empty by default, for A/B runs)
AFFINE_MMA_ROUTE = _mma_route(os.environ.get("ENGINE_AFFINE_MMA_ROUTE", ""))
#: one row of 4-bit codes through :func:`engine.runtime.nibbles_triton.gemv_nibbles` (the CUDA
#: cores; about 4 instructions a weight in the sm_90 build): by default the weights of the
#: "square" class (q/k/v, o; at ``nibbles_triton.CONFIGS``' launch; H100, Llama-3-8B's gptq /
#: awq step at one row 2.2 / 2.7 % faster over five rounds, the wide and deep classes slower
#: there: docs/benchmarks/quantization.md). ``ENGINE_W4_NIBBLES``: ``0`` none, ``1`` every
#: class, ``"NxK:BLOCK_N,TILES,split,warps,VEC[,PRE_CONST];..."`` those weights alone at those
#: launches (for A/B runs)
W4_NIBBLES = os.environ.get("ENGINE_W4_NIBBLES", "")
W4_NIBBLES_ROUTE = (launch_spec(W4_NIBBLES, "ENGINE_W4_NIBBLES",
                                "0, 1 or NxK:BLOCK_N,TILES,split,warps,VEC[,PRE_CONST]", _shape)
                    if W4_NIBBLES not in ("", "0", "1") else {})


def _nibbles_classes(value: str) -> frozenset[str]:
    """The shape classes whose one row goes to gemv_nibbles for ``ENGINE_W4_NIBBLES=value``."""
    return frozenset({"": ("square",), "1": ("square", "wide", "deep")}.get(value, ()))


#: shape classes (:func:`shape_class`) whose one row goes to gemv_nibbles (at
#: ``nibbles_triton.CONFIGS``' launch) besides the weights :data:`W4_NIBBLES_ROUTE` names
W4_NIBBLES_CLASSES = _nibbles_classes(W4_NIBBLES)
#: rows from which :func:`affine_mm` dequantizes the weight into a temporary in x's dtype and
#: hands the product to cuBLAS, by code width (prefill: the weight's bytes are then small
#: beside the product's work; 45.7 against 39.6 ms of dense bf16 at 2048 rows on the H200)
DEQUANT_ROWS: dict[int, int] = {4: 129}
#: code widths whose packed products :func:`engine.runtime.quant_methods.pack_weight_only`
#: keeps by default on a GPU (measured at least as fast as the dense copy at every row count:
#: none yet; 4-bit codes are 0.56-0.68x of the dense step up to 32 rows, 1.05x at 64, 1.8x at
#: 128)
PACKED_BITS: frozenset[int] = frozenset()

#: groups of a row one program of :func:`quant_groups` quantizes, at most (a row of 4096
#: columns in groups of 128: four programs; H100, Llama-3-8B's step at one row: 2.77 ms against
#: 2.83 with one program a row, even with two groups a program)
GROUPS_PER_PROGRAM = 8
#: code dtype -> (kernel FP8 flag, mantissa bits, smallest normal exponent, largest value)
_KINDS = {torch.int8: (0, 0, 0, 127.0), torch.float8_e4m3fn: (1, 3, -6, 448.0),
          torch.float8_e5m2: (2, 2, -14, 57344.0)}


#: round to the fp8 grid in software on every device (for A/B runs: see :func:`rne_cast`)
SOFTWARE_GRID = False


def rne_cast(device: torch.device) -> bool:
    """Whether fp8 casts in kernels on ``device`` round to nearest even (an NVIDIA GPU's
    conversion instruction), so the kernels may skip their float32 grid rounding (the same
    codes; the interpreter's cast truncates)."""
    return device.type == "cuda" and torch.version.hip is None and not SOFTWARE_GRID


def _kind(dtype: torch.dtype) -> tuple[int, int, int, float]:
    try:
        return _KINDS[dtype]
    except KeyError:
        raise ValueError(f"codes of {dtype} are not served (int8, float8_e4m3fn, "
                         "float8_e5m2)") from None


def fp8_kind(dtype: torch.dtype) -> int:
    """The kernels' fp8 flag of a torch dtype: 1 e4m3, 2 e5m2, 0 anything else."""
    return {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}.get(dtype, 0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as their uint8 bit patterns (the kernels bitcast them back)."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


@triton.jit
def _rne(v):
    """Round to the nearest integer, ties to even (|v| < 2^22)."""
    return (v + 12582912.0) - 12582912.0


@triton.jit
def _round_fp8(v, MANT: tl.constexpr, EMIN: tl.constexpr):
    """``v`` (float32, within the format's range) rounded to the fp8 grid (nearest, ties to
    even; subnormals below 2^EMIN), still float32: exactly what a cast to the fp8 type gives."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
    quantum = ((e - MANT + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - e + MANT) << 23).to(tl.float32, bitcast=True)
    return _rne(v * inverse) * quantum


@triton.jit
def fp8_from_bits(v, FP8: tl.constexpr):
    """uint8 bit patterns as the fp8 type ``FP8`` names (1: e4m3, 2: e5m2; 0: ``v`` itself).
    fp8 tensors travel as uint8, so masked loads can fill zeros."""
    if FP8 == 1:
        return v.to(tl.float8e4nv, bitcast=True)
    elif FP8 == 2:
        return v.to(tl.float8e5, bitcast=True)
    else:
        return v


@triton.jit
def _quantize(x, s, r, FP8: tl.constexpr, QMAX: tl.constexpr, MANT: tl.constexpr,
              EMIN: tl.constexpr, GRID: tl.constexpr = True):
    """float32 ``x`` / ``s`` as codes, still float32 (int8: rounded and clamped to
    [-128, 127]; fp8: saturated and rounded to the grid). ``r`` is ``1 / s`` correctly rounded;
    the quotient is ``x * r`` corrected by one fused multiply-add of its exact remainder, which
    is the correctly rounded ``x / s`` (Markstein), as torch's division gives. GRID false
    (fp8, for a caller that casts the result to the fp8 type at once, compiled for a GPU):
    saturated only, the cast's own rounding to nearest even (the GPU's conversion
    instruction) doing the grid's; the interpreter's cast truncates, so it needs GRID."""
    q = x * r
    v = tl.fma(tl.fma(-q, s, x), r, q)
    if FP8 == 0:
        return tl.minimum(tl.maximum(_rne(v), -128.0), 127.0)
    elif GRID:
        return _round_fp8(tl.minimum(tl.maximum(v, -QMAX), QMAX), MANT, EMIN)
    else:
        return tl.minimum(tl.maximum(v, -QMAX), QMAX)


@triton.jit
def _signed(c, y):
    """``c`` (``y`` rounded to a grid: the same sign, or zero) with ``y``'s sign bit, so that a
    negative value rounding to zero gives -0 as a cast does."""
    yb = y.to(tl.float32).to(tl.int32, bitcast=True)
    return (c.to(tl.int32, bitcast=True) | ((yb >> 31) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _codes(q, FP8: tl.constexpr):
    """float32 codes in the operand type of a product with the weight codes."""
    if FP8 == 0:
        return q.to(tl.int8)
    elif FP8 == 1:
        return q.to(tl.float8e4nv)
    else:
        return q.to(tl.float8e5)


@triton.jit
def _row_scales(x_rows, m_ok, K, QMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                AMAX_BLOCK: tl.constexpr):
    """Dynamic per-row scales: each row's absolute maximum over QMAX (at least 1e-12), correctly
    rounded, as the torch quantizers compute them."""
    amax = tl.zeros((BLOCK_M, AMAX_BLOCK), dtype=tl.float32)
    for a0 in range(0, K, AMAX_BLOCK):
        offs_a = a0 + tl.arange(0, AMAX_BLOCK)
        v = tl.load(x_rows + offs_a[None, :], mask=m_ok[:, None] & (offs_a < K)[None, :],
                    other=0.0)
        amax = tl.maximum(amax, tl.abs(v.to(tl.float32)))
    return tl.math.div_rn(tl.maximum(tl.max(amax, axis=1), 1e-12), QMAX)


@triton.jit
def _row1_scale(x_ptr, K, QMAX: tl.constexpr, AMAX_BLOCK: tl.constexpr,
                AMAX_CHUNKS: tl.constexpr):
    """The one row's dynamic scale (as :func:`_row_scales`). AMAX_CHUNKS > 0: K is covered by
    that many blocks, unrolled so that every load is in flight at once (one trip to L2 instead
    of one a block, before a program can quantize its first tile); 0: a loop over K."""
    amax = tl.zeros((AMAX_BLOCK,), dtype=tl.float32)
    if AMAX_CHUNKS > 0:
        for c in tl.static_range(AMAX_CHUNKS):
            offs_a = c * AMAX_BLOCK + tl.arange(0, AMAX_BLOCK)
            v = tl.load(x_ptr + offs_a, mask=offs_a < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(v.to(tl.float32)))
    else:
        for a0 in range(0, K, AMAX_BLOCK):
            offs_a = a0 + tl.arange(0, AMAX_BLOCK)
            v = tl.load(x_ptr + offs_a, mask=offs_a < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(v.to(tl.float32)))
    return tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), 1e-12), QMAX)


@triton.jit
def _slice(K, pid_k, split_k, STEP: tl.constexpr, SPLIT: tl.constexpr):
    """[lo, hi) of K for slice ``pid_k`` of ``split_k`` (whole steps of STEP); all of K when
    not SPLIT (a loop from 0 to K, which the software pipeliner handles best)."""
    if SPLIT:
        steps = tl.cdiv(tl.cdiv(K, STEP), split_k)
        lo = pid_k * steps * STEP
        hi = tl.minimum(K, lo + steps * STEP)
    else:
        lo = 0
        hi = K
    return lo, hi


@triton.jit
def _finish(acc, row_s, col_s, pid_n, pid_k, offs_m, offs_n, m_ok, n_ok, bias_ptr, y_ptr,
            part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS: tl.constexpr,
            BLOCK_M: tl.constexpr, SPLIT: tl.constexpr):
    """Write ``acc`` [BLOCK_M, BLOCK_N] (sums of slice ``pid_k``: float32, or int32 for int8
    codes) times ``row_s`` [BLOCK_M, 1] and ``col_s`` [1, BLOCK_N], plus the bias: directly with
    one slice (SPLIT false); else the raw sums go to the workspace (int32 as their bits, so the
    total is exact), and the last of the ``split_k`` slices of the block adds them up."""
    out = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT:
        rows = part_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(rows + pid_k * BLOCK_M * N, acc.to(tl.float32, bitcast=True), mask=mask)
        tl.debug_barrier()  # every thread's partials issued before the release below
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == split_k - 1:
            total = tl.zeros_like(acc)
            for s in range(split_k):
                part = tl.load(rows + s * BLOCK_M * N, mask=mask, other=0.0,
                               cache_modifier=".cg")
                total += part.to(acc.dtype, bitcast=True)
            y = total.to(tl.float32) * row_s * col_s
            if HAS_BIAS:
                y += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(out, y.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
    else:
        y = acc.to(tl.float32) * row_s * col_s
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _affine_constants(s, b):
    """A group's scale and bias as loaded -> both in float32. float32 as stored; the compact
    form (16-bit, :meth:`engine.runtime.quant_methods.AffineWeight.pack`) stores ``b / s``
    in place of ``b``, whose product with ``s`` is exact in float32, so both forms give the
    same values. (The stored dtype is known when the kernel is compiled: no branch runs.)"""
    s = s.to(tl.float32)
    if b.dtype == tl.float32:
        return s, b
    return s, b.to(tl.float32) * s


@triton.jit
def _group_affine(s_ptr, b_ptr, k0, N, K, offs_n, n_ok, GROUP: tl.constexpr):
    """The scales and biases [BLOCK_N] of the group holding column ``k0`` in float32 (zeros
    past K: the padding's weights are zero)."""
    g = (k0 // GROUP) * N
    s_ok = n_ok & (offs_n * 0 + k0 < K)
    return _affine_constants(tl.load(s_ptr + g + offs_n, mask=s_ok, other=0.0),
                             tl.load(b_ptr + g + offs_n, mask=s_ok, other=0.0))


@triton.jit
def _x_slice(x_rows, perm_ptr, offs_k, m_ok, K, HAS_PERM: tl.constexpr):
    """x's columns ``offs_k`` (through the act-order permutation when HAS_PERM; zeros past
    K)."""
    if HAS_PERM:
        src = tl.load(perm_ptr + offs_k, mask=offs_k < K, other=0)
    else:
        src = offs_k
    return tl.load(x_rows + src[None, :], mask=m_ok[:, None] & (offs_k < K)[None, :],
                   other=0.0)


@triton.jit
def _affine_mm(x_ptr, q_ptr, s_ptr, b_ptr, perm_ptr, bias_ptr, y_ptr, M, N, K,
               stride_xm, stride_qn, stride_ym,
               BITS: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
               HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, TILES: tl.constexpr, PDL: tl.constexpr):
    """Per slice of SUB columns (one group): the codes, exact in the activation dtype, go
    through ``tl.dot``; the group's scale multiplies that sum and its bias the sum of x."""
    pdl_trigger(PDL)
    pdl_wait(PDL)
    PER: tl.constexpr = 32 // BITS
    PACK: tl.constexpr = PER * SUB
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_i = tl.arange(0, SUB)
    n_ok = offs_n < N
    m_ok = offs_m < M
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * stride_qn
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t0 in range(0, tl.cdiv(K, PACK), TILES):
        for u in tl.static_range(TILES):
            t = t0 + u
            words = tl.load(q_rows + (t * SUB + offs_i)[None, :], mask=n_ok[:, None], other=0)
            for j in tl.static_range(PER):
                k0 = t * PACK + j * SUB
                s, b = _group_affine(s_ptr, b_ptr, k0, N, K, offs_n, n_ok, GROUP)
                c = ((words >> (j * BITS)) & ((1 << BITS) - 1)).to(x_ptr.dtype.element_ty)
                x = _x_slice(x_rows, perm_ptr, k0 + offs_i, m_ok, K, HAS_PERM)
                part = tl.dot(x, tl.trans(c))
                xsum = tl.sum(x.to(tl.float32), axis=1)
                acc += part * s[None, :] + xsum[:, None] * b[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _dequant_affine(q_ptr, s_ptr, b_ptr, w_ptr, N, K, stride_qn, stride_wn,
                    BITS: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
                    BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """One program: the weights of BLOCK_N outputs in packed tile ``program_id(1)``, as
    ``q * s + b`` in float32 rounded to ``w``'s dtype (columns past K not stored)."""
    pdl_trigger(PDL)
    PER: tl.constexpr = 32 // BITS
    PACK: tl.constexpr = PER * SUB
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t = tl.program_id(1)
    offs_i = tl.arange(0, SUB)
    n_ok = offs_n < N
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * stride_qn
    words = tl.load(q_rows + (t * SUB + offs_i)[None, :], mask=n_ok[:, None], other=0)
    pdl_wait(PDL)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    for j in tl.static_range(PER):
        k0 = t * PACK + j * SUB
        s, b = _group_affine(s_ptr, b_ptr, k0, N, K, offs_n, n_ok, GROUP)
        c = ((words >> (j * BITS)) & ((1 << BITS) - 1)).to(tl.float32)
        cols = k0 + offs_i
        w = (c * s[:, None] + b[:, None]).to(w_ptr.dtype.element_ty)
        tl.store(w_rows + cols[None, :], w, mask=n_ok[:, None] & (cols < K)[None, :])


@triton.jit
def _quant_rows(x_ptr, xq_ptr, xs_ptr, static_ptr, K, stride_xm, stride_qm,
                STATIC: tl.constexpr, FP8: tl.constexpr, QMAX: tl.constexpr,
                MANT: tl.constexpr, EMIN: tl.constexpr, BLOCK: tl.constexpr,
                PDL: tl.constexpr):
    """One row's scale (dynamic: its absolute maximum over QMAX; or the static one) and
    codes."""
    pdl_trigger(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    if STATIC:
        s = tl.load(static_ptr)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(v.to(tl.float32)))
        s = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), 1e-12), QMAX)
    r = tl.math.div_rn(1.0, s)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = _codes(_quantize(v, s, r, FP8, QMAX, MANT, EMIN), FP8)
        if FP8 != 0:
            q = q.to(tl.uint8, bitcast=True)
        tl.store(xq_ptr + row * stride_qm + offs, q, mask=offs < K)
    tl.store(xs_ptr + row, s)


@triton.jit
def _wsb(ws_rows, k0, BLOCK_K: tl.constexpr, n_ok):
    """The weight block scales of the tile at ``k0``, one per output."""
    return tl.load(ws_rows + k0 // BLOCK_K, mask=n_ok, other=0.0)


@triton.jit
def _w8_mm(x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
           stride_xm, stride_wn, stride_wsn, stride_ym, split_k,
           ACT: tl.constexpr, W_BLOCK_N: tl.constexpr, FP8: tl.constexpr, QMAX: tl.constexpr,
           MANT: tl.constexpr, EMIN: tl.constexpr, HAS_BIAS: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           AMAX_BLOCK: tl.constexpr, ROW1: tl.constexpr, SPLIT: tl.constexpr,
           PDL: tl.constexpr):
    """ACT 0: ``x`` unquantized (W8A16); 1: quantized per row here, the scale from the row's
    absolute maximum; 2: quantized per row and BLOCK_K columns here (fp8); 3: quantized with
    the static scale ``xs[0]``; 4: ``x`` holds codes with per-row scales ``xs``
    (:func:`_quant_rows`). W_BLOCK_N 0: one weight scale per output row (applied at the end);
    else block scales ``ws[n // W_BLOCK_N, k // BLOCK_K]``. ROW1: one row in a ``tl.dot``
    block: only it is quantized, the padding rows are zeros. SPLIT: one of ``split_k`` slices of
    K (one block of rows only), summed by :func:`_finish`."""
    pdl_trigger(PDL)
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    INT: tl.constexpr = FP8 == 0 and ACT != 0
    PER_ROW: tl.constexpr = ACT == 1 or ACT == 3 or ACT == 4
    if W_BLOCK_N > 0:
        ws_rows = ws_ptr + (offs_n // W_BLOCK_N).to(tl.int64) * stride_wsn
    if ACT == 1 and ROW1:  # one row (padded for tl.dot): its scale from a first pass
        xs = tl.zeros((BLOCK_M,), dtype=tl.float32) + _row1_scale(x_ptr, K, QMAX, AMAX_BLOCK, 0)
    elif ACT == 1:  # the rows' scales: a first pass over x (a few rows: it stays in cache)
        xs = _row_scales(x_rows, m_ok, K, QMAX, BLOCK_M, AMAX_BLOCK)
    elif ACT == 3:
        xs = tl.zeros((BLOCK_M,), dtype=tl.float32) + tl.load(xs_ptr)
    elif ACT == 4:
        xs = tl.load(xs_ptr + offs_m, mask=m_ok, other=1.0)
    if ACT == 1 or ACT == 3:
        xr = tl.math.div_rn(tl.zeros((BLOCK_M,), dtype=tl.float32) + 1.0, xs)
    if INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo, k_hi = _slice(K, pid_k, split_k, BLOCK_K, SPLIT)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = fp8_from_bits(tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                            other=0), FP8)
        if ROW1 and ACT != 0 and ACT != 4:  # one row, quantized once, padded with zeros
            x = tl.load(x_ptr + offs_k, mask=k_ok, other=0)[None, :]
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0)
        # the tile's operands (a: activations or their codes)
        # and its scale (None: one per row and output, applied at the end)
        if ACT == 0:
            a = x
        elif ACT == 2:
            xf = x.to(tl.float32)
            sg = tl.math.div_rn(tl.maximum(tl.max(tl.abs(xf), axis=1), 1e-12), QMAX)
            rg = tl.math.div_rn(tl.zeros_like(sg) + 1.0, sg)
            a = _quantize(xf, sg[:, None], rg[:, None], FP8, QMAX, MANT, EMIN)
            if ROW1:
                sg = tl.zeros((BLOCK_M,), dtype=tl.float32) + tl.sum(sg, axis=0)
        elif ACT == 4:
            a = fp8_from_bits(x, FP8)
        elif ROW1:
            a = _quantize(x.to(tl.float32), tl.sum(xs, axis=0) / BLOCK_M,
                          tl.sum(xr, axis=0) / BLOCK_M, FP8, QMAX, MANT, EMIN)
        else:
            a = _quantize(x.to(tl.float32), xs[:, None], xr[:, None], FP8, QMAX, MANT, EMIN)
        if ROW1 and ACT != 0 and ACT != 4:
            a = tl.where((offs_m == 0)[:, None], a, 0.0)
        TILE_SCALE: tl.constexpr = ACT == 2 or W_BLOCK_N > 0
        if TILE_SCALE:
            if ACT == 2 and W_BLOCK_N > 0:
                scale = sg[:, None] * _wsb(ws_rows, k0, BLOCK_K, n_ok)[None, :]
            elif ACT == 2:
                scale = sg[:, None] + tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            else:
                scale = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) \
                    + _wsb(ws_rows, k0, BLOCK_K, n_ok)[None, :]
        if ACT == 0:
            part = tl.dot(a, tl.trans(w.to(x_ptr.dtype.element_ty)))
        else:
            if ACT != 4:
                a = _codes(a, FP8)
            if INT:
                part = tl.dot(a, tl.trans(w), out_dtype=tl.int32)
            else:
                part = tl.dot(a, tl.trans(w))
        if TILE_SCALE:
            acc += part * scale
        else:
            acc += part
    if PER_ROW:
        row_s = xs[:, None]
    else:
        row_s = tl.full((BLOCK_M, 1), 1.0, tl.float32)
    if W_BLOCK_N == 0:
        col_s = tl.load(ws_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    else:
        col_s = tl.full((1, BLOCK_N), 1.0, tl.float32)
    _finish(acc, row_s, col_s, pid_n, pid_k, offs_m, offs_n, m_ok, n_ok, bias_ptr, y_ptr,
            part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS, BLOCK_M, SPLIT)


# ---------------------------------------------------------------- launch configurations

#: float32 partial sums per device: split_k * rows * outputs must fit
WORKSPACE_FLOATS = 1 << 22
COUNTERS = 1 << 16

_workspaces: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ws = _workspaces.get(device)
    if ws is None:
        ws = (torch.empty(WORKSPACE_FLOATS, dtype=torch.float32, device=device),
              torch.zeros(COUNTERS, dtype=torch.int32, device=device))
        _workspaces[device] = ws
    return ws


def _split(split: int, n: int, bn: int, rows: int) -> int:
    """``split`` when the workspace and counters hold it, else 1."""
    if split > 1 and (split * rows * n > WORKSPACE_FLOATS or triton.cdiv(n, bn) > COUNTERS):
        return 1
    return split


def _rows_block(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


#: (BLOCK_N, TILES, warps, stages) per row block (a tile is 32/bits slices of SUB columns),
#: chosen on an H200 by a sweep of an earlier ``benchmarks/quant_gpu.py`` (from 5 rows; up
#: to 4 rows :func:`engine.runtime.gemv_triton.gemv_affine` serves)
AFFINE_CONFIGS = {16: (16, 1, 4, 3), 32: (64, 1, 4, 3), 64: (128, 1, 4, 3)}
#: (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) of the ``tl.dot`` kernel per row block (split
#: only when one block holds every row)
W8_CONFIGS = {16: (32, 256, 1, 4, 4), 32: (64, 128, 1, 4, 3), 64: (128, 128, 1, 8, 3)}
#: the same for block-scaled weights (BLOCK_K is the scale block's)
W8_BLOCK_CONFIGS = {16: (32, 128, 1, 4, 4), 32: (64, 128, 1, 4, 3), 64: (128, 128, 1, 8, 3)}
#: up to GEMV_ROWS rows: (kernel, launch) by (activations: "a16" unquantized, "a8" per row,
#: "block" block fp8; :func:`shape_class`). "gemv": :func:`engine.runtime.gemv_triton.gemv`
#: (elementwise; one row only: from two rows the ``tl.dot`` kernel with its 16-row launch is
#: faster); "dot": the ``tl.dot`` kernel, the rows padded to 16. Chosen on an H200 by
#: ``benchmarks/gemv_gpu.py --search`` (docs/benchmarks/quantization.md).
W8_SMALL = {("a16", "square"): ("gemv", (8, 1024, 1, 4, 3)),
            ("a16", "wide"): ("gemv", (8, 1024, 1, 4, 3)),
            ("a16", "deep"): ("gemv", (8, 1024, 1, 4, 3)),
            ("a8", "square"): ("gemv", (8, 1024, 1, 4, 3)),
            ("a8", "wide"): ("dot", (32, 256, 1, 4, 4)),
            ("a8", "deep"): ("gemv", (8, 1024, 1, 4, 3)),
            ("block", "square"): ("dot", (64, 128, 8, 2, 3)),
            ("block", "wide"): ("dot", (64, 128, 8, 2, 3)),
            ("block", "deep"): ("dot", (16, 128, 8, 2, 3))}


def shape_class(n: int, k: int) -> str:
    """A weight [n, k]'s class for launch tables: "deep" (k > n: down projections), "wide"
    (n >= 4k: fused gate/up), else "square" (q/k/v, o)."""
    return "deep" if k > n else "wide" if n >= 4 * k else "square"


def affine_sub(group: int) -> int | None:
    """Columns per slice for ``group`` (32, or the group when smaller); ``None`` when the group
    size cannot be sliced (not a power of two below 32, nor a multiple of 32)."""
    if group % 32 == 0:
        return 32
    return group if group in (16,) else None


def pack_affine(codes: torch.Tensor, bits: int, sub: int) -> torch.Tensor:
    """int codes [N, K] -> int32 words [N, ceil(K / PACK) * sub] in the layout of
    :func:`affine_mm` (PACK = 32 / bits * sub; K padded with zero codes)."""
    per = 32 // bits
    n, k = codes.shape
    pack = per * sub
    pad = (-k) % pack
    c = torch.nn.functional.pad(codes.to(torch.int64), (0, pad)).reshape(n, -1, per, sub)
    shifts = (torch.arange(per, device=c.device, dtype=torch.int64) * bits).reshape(1, 1, per, 1)
    words = ((c & ((1 << bits) - 1)) << shifts).sum(2)  # [N, tiles, sub]
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.reshape(n, -1).to(torch.int32).contiguous()


def affine_mm(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias_: torch.Tensor,
              bits: int, group: int, sub: int, perm: torch.Tensor | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [M, K] @ W^T with W in the canonical affine form (see the module docstring):
    ``q`` from :func:`pack_affine`, ``scale``/``bias_`` float32 [K / group, N], or the compact
    form of :func:`engine.runtime.quant_methods.compact_constants` (16-bit ``scale`` and
    ``bias_ / scale``; every kernel here reads both, :func:`_affine_constants`)."""
    if perm is not None:  # act order: x's columns gathered once, not inside every program
        x, perm = x.index_select(1, perm), None
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    if m == 1 and x.is_cuda and (W4_NIBBLES_CLASSES or W4_NIBBLES_ROUTE):
        from engine.runtime import nibbles_triton as nt

        nib = W4_NIBBLES_ROUTE.get((q.shape[0], k))
        if nt.serves(x, bits, group, sub) and (
                nib is not None or shape_class(q.shape[0], k) in W4_NIBBLES_CLASSES):
            return nt.gemv_nibbles(x, q, scale, bias_, group, sub, bias=bias, config=nib)
    launch = AFFINE_MMA_ROUTE.get((q.shape[0], k)) if AFFINE_MMA_ROUTE else None
    if m == 1 and x.is_cuda and (AFFINE_MMA or launch is not None):
        from engine.runtime import affine_mma as am

        if am.supported(x, bits, group, sub, k):
            return am.affine_mma(x, q, scale, bias_, group, bias=bias, config=launch)
    if m >= DEQUANT_ROWS.get(bits, 1 << 62):
        w = dequant_affine(q, scale, bias_, bits, group, sub, k, x.dtype)
        return torch.nn.functional.linear(x, w, bias)
    first, last = AFFINE_SWAP.get(bits, (0, -1))
    one_row_gemv = m == 1 and (q.shape[0], k) in AFFINE_ONE_ROW_GEMV.get(bits, ())
    if (first <= m <= last and not one_row_gemv and x.dtype in (torch.bfloat16, torch.float16)
            and sub in (16, 32) and group % sub == 0):
        from engine.runtime.swap_affine import affine_swap

        return affine_swap(x, q, scale, bias_, bits, group, sub, perm=perm, bias=bias)
    if m <= GEMV_ROWS:
        from engine.runtime.gemv_triton import gemv_affine

        return gemv_affine(x, q, scale, bias_, bits, group, sub, perm=perm, bias=bias)
    n = q.shape[0]
    bm = _rows_block(m)
    bn, tiles, warps, stages = AFFINE_CONFIGS[bm]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
    tiles = min(tiles, triton.cdiv(k, 32 // bits * sub))
    if triton.cdiv(k, 32 // bits * sub) % tiles:
        tiles = 1
    _affine_mm[grid](x, q, scale, bias_, perm if perm is not None else q,
                     bias if bias is not None else y, y, m, n, k, x.stride(0), q.stride(0),
                     y.stride(0), BITS=bits, GROUP=group, SUB=sub, HAS_PERM=perm is not None,
                     HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, TILES=tiles,
                     num_warps=warps, num_stages=stages, **launch_options(x.device))
    return y


def dequant_affine(q: torch.Tensor, scale: torch.Tensor, bias_: torch.Tensor, bits: int,
                   group: int, sub: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The weight [N, k] in ``dtype`` that the packed affine form stands for (columns in the
    packed order: act-order weights multiply ``x[:, perm]``), for products of many rows
    (:data:`DEQUANT_ROWS`) that cuBLAS serves faster than the packed kernels."""
    n = q.shape[0]
    w = torch.empty((n, k), dtype=dtype, device=q.device)
    bn = 64
    grid = (triton.cdiv(n, bn), triton.cdiv(k, 32 // bits * sub))
    _dequant_affine[grid](q, scale, bias_, w, n, k, q.stride(0), w.stride(0), BITS=bits,
                          GROUP=group, SUB=sub, BLOCK_N=bn, num_warps=4,
                          **launch_options(q.device))
    return w


def quant_rows(x: torch.Tensor, dtype: torch.dtype, static: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [M, K] of ``dtype`` (int8 or an fp8 type), float32 scales [M]) of ``x``, each
    row quantized by its absolute maximum, or by ``static`` (one scale)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    fp8, mant, emin, qmax = _kind(dtype)
    xq = torch.empty((m, k), dtype=dtype, device=x.device)
    xs = torch.empty((m,), dtype=torch.float32, device=x.device)
    _quant_rows[(m,)](x, _bits(xq), xs, static if static is not None else xs, k, x.stride(0),
                      xq.stride(0), STATIC=static is not None, FP8=fp8, QMAX=qmax,
                      MANT=mant, EMIN=emin, BLOCK=min(1024, triton.next_power_of_2(k)),
                      num_warps=4, **launch_options(x.device))
    return xq, xs


@triton.jit
def _quant_groups(x_ptr, xq_ptr, xs_ptr, M, K, stride_xm, stride_qm, FP8: tl.constexpr,
                  QMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                  GROUP: tl.constexpr, GROUPS: tl.constexpr, GRID: tl.constexpr,
                  PDL: tl.constexpr):
    """Program (row, b): groups ``b * GROUPS ..`` of ``GROUP`` columns of one row: each
    group's scale (its absolute maximum over QMAX, correctly rounded) into ``xs`` [K / GROUP,
    M] (so that xs.t() is the [M, K / GROUP] column-major operand of a block-scaled product)
    and its codes, as the torch quantizer makes them (-0 included)."""
    pdl_trigger(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)[:, None]  # [GROUPS, 1]
    col = g * GROUP + tl.arange(0, GROUP)[None, :]
    ok = col < K
    v = tl.load(x_ptr + row * stride_xm + col, mask=ok, other=0.0).to(tl.float32)
    _store_group_codes(v, xq_ptr + row * stride_qm + col, ok, xs_ptr + g * M + row,
                       g * GROUP < K, FP8, QMAX, MANT, EMIN, GRID)


@triton.jit
def _store_group_codes(v, q_ptrs, ok, s_ptrs, s_ok, FP8: tl.constexpr, QMAX: tl.constexpr,
                       MANT: tl.constexpr, EMIN: tl.constexpr, GRID: tl.constexpr):
    """Quantize float32 ``v`` [GROUPS, GROUP] (one group a row, masked lanes 0) as
    :func:`_quant_groups` does (and the torch quantizer: each group's scale its absolute
    maximum over QMAX, correctly rounded; -0 kept) and store its codes at ``q_ptrs`` and its
    scales [GROUPS, 1] at ``s_ptrs``: the kernels that write a layer's input (norm, SiLU-and-mul)
    and :func:`quant_groups` share it, so their codes agree bit for bit. GRID: the codes
    rounded to the fp8 grid in software (else by the cast: :func:`rne_cast`)."""
    s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(v), axis=1), 1e-12), QMAX)[:, None]
    r = tl.math.div_rn(1.0, s)
    q = _codes(_signed(_quantize(v, s, r, FP8, QMAX, MANT, EMIN, GRID), v), FP8)
    if FP8 != 0:
        q = q.to(tl.uint8, bitcast=True)
    tl.store(q_ptrs, q, mask=ok)
    tl.store(s_ptrs, s, mask=s_ok)


def group_code_buffers(m: int, k: int, dtype: torch.dtype, group: int,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Room for ``m`` rows of ``k`` columns as ``dtype`` (fp8) codes per group of ``group``
    columns (``k`` whole power-of-two groups): the codes [m, k], the float32 scales [k / group,
    m] (their ``.t()`` the column-major [m, k / group] a product reads), and the constexprs
    (FP8, QMAX, MANT, EMIN, GRID) of :func:`_store_group_codes` for a kernel on ``device``;
    every kernel that writes group codes allocates and launches through it."""
    if k % group or group != triton.next_power_of_2(group):
        raise ValueError(f"{k} columns in groups of {group}: not whole power-of-two groups")
    fp8, mant, emin, qmax = _kind(dtype)
    codes = torch.empty((m, k), dtype=dtype, device=device)
    scales = torch.empty((k // group, m), dtype=torch.float32, device=device)
    return codes, scales, dict(FP8=fp8, QMAX=qmax, MANT=mant, EMIN=emin,
                               GRID=not rne_cast(device))


def quant_groups(x: torch.Tensor, dtype: torch.dtype,
                 group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [M, K] of the fp8 ``dtype``, float32 scales [M, K / group] column-major) of
    ``x`` [M, K] quantized per row and group of ``group`` columns (``K`` a multiple of it, a
    power of two): exactly :func:`engine.runtime.quant_formats.quantize_fp8_groups`, in one
    kernel."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    xq, xs, fmt = group_code_buffers(m, k, dtype, group, x.device)
    per = max(1, min(k // group, 4096 // group, GROUPS_PER_PROGRAM))
    _quant_groups[(m, triton.cdiv(k // group, per))](
        x, _bits(xq), xs, m, k, x.stride(0), xq.stride(0), GROUP=group,
        GROUPS=triton.next_power_of_2(per), num_warps=4, **fmt, **launch_options(x.device))
    return xq, xs.t()


def w8_mm(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, *, act: str | None = None,
          x_scale: torch.Tensor | None = None, block: tuple[int, int] | None = None,
          out_dtype: torch.dtype | None = None, bias: torch.Tensor | None = None,
          path: str | None = None, config: tuple | None = None) -> torch.Tensor:
    """``x`` [M, K] @ W^T for fp8/int8 ``w`` [N, K]. ``act``: ``None`` (W8A16), ``"token"``
    (quantized per row to ``w``'s type, dynamic), ``"static"`` (``x_scale``: one scale),
    ``"group"`` (fp8 per row and block of ``block[1]`` columns). ``w_scale``: [N] per output
    row, or with ``block`` = (bn, bk) the block scales [ceil(N/bn), ceil(K/bk)]. Up to
    :data:`SWAP_ROWS` rows, weights that :func:`engine.runtime.swap_triton.small_config`
    lists go to the swapped-operand kernel (weights on the wide side of the tensor cores); else
    up to :data:`GEMV_ROWS` rows the kernel and launch come from :data:`W8_SMALL` (``path``:
    ``"gemv"``, ``"dot"`` or ``"swap"``, and ``config`` override them); from 2 rows in
    ``tl.dot`` dynamic per-row codes are made by :func:`quant_rows` first."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    n = w.shape[0]
    if act == "group" and block is None:
        raise ValueError("activations quantized per group need block weight scales")
    fp8, mant, emin, qmax = _kind(w.dtype)
    if (path == "swap" or (path is None and config is None)) and m <= SWAP_ROWS:
        from engine.runtime import swap_triton

        swap = (config if path == "swap"
                else swap_triton.small_config(w.dtype, act, block, n, k, m))
        if swap is not None or path == "swap":
            return swap_triton.w8_swap(x, w, w_scale, act=act, x_scale=x_scale, block=block,
                                       out_dtype=out_dtype, bias=bias, config=swap)
    if m <= GEMV_ROWS:
        kind = "block" if block is not None else "a16" if act is None else "a8"
        small_path, small_cfg = W8_SMALL[(kind, shape_class(n, k))]
        if small_path == "gemv" and m > 1 and path is None:
            small_path, small_cfg = "dot", None  # elementwise is slower from two rows
        path, config = path or small_path, config or small_cfg
        if path == "gemv":
            from engine.runtime.gemv_triton import gemv

            return gemv(x, w, w_scale, act=act, x_scale=x_scale, block=block,
                        out_dtype=out_dtype, bias=bias, config=config)
    bm = _rows_block(m)
    bn, bk, split, warps, stages = config or (W8_CONFIGS if block is None
                                              else W8_BLOCK_CONFIGS)[bm]
    if block is not None:
        bk = block[1]
    split = _split(split, n, bn, bm) if m <= bm else 1
    code = {None: 0, "token": 1, "group": 2, "static": 3}[act]
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if code in (1, 3) and m > 1:  # rows for tl.dot: their codes first
        x, x_scale = quant_rows(x, w.dtype, static=x_scale if code == 3 else None)
        code = 4
    part, cnt = _workspace(x.device)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm), split)
    _w8_mm[grid](_bits(x), x_scale if x_scale is not None else w_scale, _bits(w), w_scale,
                 bias if bias is not None else y, y, part, cnt, m, n, k, x.stride(0),
                 w.stride(0), w_scale.stride(0), y.stride(0), split, ACT=code,
                 W_BLOCK_N=block[0] if block else 0, FP8=fp8, QMAX=qmax, MANT=mant, EMIN=emin,
                 HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                 AMAX_BLOCK=min(max(4096 // bm, 512), triton.next_power_of_2(k)),
                 ROW1=m == 1, SPLIT=split > 1, num_warps=warps, num_stages=stages,
                 **launch_options(x.device))
    return y
