"""Weight-only affine products for a few rows with the operands swapped, in Triton.

:func:`affine_swap` computes :func:`engine.runtime.quant_triton.affine_mm` (GPTQ, AWQ and the
other integer formats in the canonical packed form of
:func:`engine.runtime.quant_triton.pack_affine`: ``W[n, k] = q[n, k] * scale[g, n] + bias[g,
n]``, ``g = k // group``, unsigned 2-, 4- or 8-bit codes) as ``y^T = W x^T``: each program owns
``BLOCK_N`` (64 or 128) output features of a block of BLOCK_M rows (16, 32, 64 or
:data:`MAX_ROWS`) and accumulates ``[BLOCK_N, BLOCK_M] += W[BLOCK_N, SUB] @ x^T[SUB, BLOCK_M]``
per slice of SUB columns, so the weights are the M side of the matrix unit (Hopper's
warp-group instructions, four warps a group) and the rows the N side, padded to the block (rows
past M repeat the last row; their results are never stored). A few rows (decode) take one
block; many rows (prefill) take one program per block of rows and outputs, each reading its
weights' codes (from L2 after the first block), so the codes never exist dequantized in memory.

The codes become 16-bit floats by their bit pattern alone: the field of a code or'ed into the
mantissa of a power of two, ``0x4300 | q`` = 128 + q as bfloat16 (``0x6400 | q`` = 1024 + q as
float16; 8-bit codes with bfloat16 activations: the low nibble as 128 + lo and the high one as
``0x4500 | hi`` = 2048 + 16 hi, two products into the same sum). With OFFSET that constant
(128, 1024 or 2176), a slice's product is ``sum_k x_k (OFFSET + q_k)``, exact products summed
in float32, and the group's affine folds in as

    sum_k x_k w_k = s * product + (b - OFFSET s) * sum_k x_k

once per chunk of slices inside one group. One int32 word of the packed form holds the same
column of 32/bits consecutive slices; the matrix unit's register operand holds two neighbouring
columns of a slice in one register. So each pair of neighbouring words is interleaved by halves
(two byte permutes: their low halves side by side, their high halves side by side, each shared
by the slices whose codes lie there), and each slice then costs a shift and one three-input
logic operation per register of two weights: about one integer operation per weight
(:func:`_field_values`). That step is inline PTX with one input and one output, which Triton
lets the operand's layout pass through: the words load from shared memory straight into the
layout of the warp-group instruction's register operand, with no conversion of the 16-bit
values.

The row sums ``sum_k x_k`` come from the activations in registers (XSUM 0: summed over the
chunk elementwise, reduced once per chunk; one row: a scalar) or from the matrix unit (XSUM 1:
ones times the same activations). One row (XSUM 2) puts the groups of a program's slice of K
in the product's columns instead: the operand's column c carries the row's activations on the
columns of the slice's c-th group and zeros elsewhere, so one accumulator keeps every group's
sum apart through the whole slice (no scale or row sum inside the loop: they come in once, at
the end), and the slice is cut to at most 16 groups (:func:`_cols_product`). XSUM 3 is the
same with eight columns: slices of at most 8 groups (more of them), half the activation tiles
a stage of shared memory and half the row-sum additions (Triton 3.6 takes the synchronous
``mma.sync`` m16n8k16 for the narrower product: no warp-group waits). With ``SPLIT_K >
1`` each of that many programs per output block takes a slice of the packed tiles and the last
to finish adds the slices up (:func:`engine.runtime.quant_triton._finish`).

Launched with programmatic dependent launch (:mod:`engine.runtime.triton_pdl`): every program
lets the next kernel launch at once, asks for its first tile of packed words and for the scales
and biases of its slice of K to be brought into L2 before it waits for the previous kernel of
the stream, and reads the activations (and writes anything) only after the wait. The packed
words and the activation slices reach shared memory through Triton's software pipelining
(``num_stages``). Under the Triton interpreter (tests) the codes take the elementwise form of
the same values, and bfloat16 products are taken in float32 (the interpreter multiplies
bfloat16 operands as their raw bits); the products are exact either way.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from engine.runtime.quant_triton import (_affine_constants, _finish, _slice, _split, _workspace,
                                         launch_spec, shape_class)
from engine.runtime.triton_pdl import launch_options, pdl_trigger, pdl_wait, prefetch_l2

#: rows of one program (the N side of the product, rows padded to a block of 16, 32, 64 or
#: this many); more rows take more programs along the grid's third axis
MAX_ROWS = 128


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


if hasattr(triton, "constexpr_function"):
    @triton.constexpr_function
    def _field_asm(pos, width, magic):
        """PTX for two neighbouring words a, b -> one register of two 16-bit floats: the
        ``width``-bit fields at bit ``pos`` of a (low half) and of b (high half), or'ed with
        ``magic``. A byte permute puts the 16-bit halves holding the fields side by side, a
        shift moves them to bit 0, one logic operation masks them and sets the exponent."""
        sel = "0x5410" if pos < 16 else "0x7632"
        steps = [f"prmt.b32 t, $1, $2, {sel};"]
        if pos % 16:
            steps.append(f"shr.u32 t, t, {pos % 16};")
        steps.append(f"lop3.b32 $0, t, {((1 << width) - 1) * 0x10001:#x}, "
                     f"{magic * 0x10001:#x}, 0xea;")
        return "{ .reg .b32 t; " + " ".join(steps) + " }"
else:  # (a Triton without constexpr functions takes the elementwise form: ASM is off)
    _field_asm = None


@triton.jit
def _field_values(words, POS: tl.constexpr, WIDTH: tl.constexpr, MAGIC: tl.constexpr,
                  F16: tl.constexpr, ASM: tl.constexpr):
    """The WIDTH-bit fields at bit POS of the int32 ``words`` as the 16-bit floats whose bit
    pattern is ``MAGIC | field`` (float16 when F16, else bfloat16): exactly the power of two
    MAGIC stands for plus the field times its unit. ASM: two words per piece of inline PTX
    (:func:`_field_asm`), the same values."""
    if ASM and F16:
        v = tl.inline_asm_elementwise(_field_asm(POS, WIDTH, MAGIC), "=r,r,r", [words],
                                      dtype=tl.float16, is_pure=True, pack=2)
    elif ASM:
        v = tl.inline_asm_elementwise(_field_asm(POS, WIDTH, MAGIC), "=r,r,r", [words],
                                      dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        bits = (((words >> POS) & ((1 << WIDTH) - 1)) | MAGIC).to(tl.int16)
        v = bits.to(tl.float16 if F16 else tl.bfloat16, bitcast=True)
    return v


@triton.jit
def _mma(w, x, acc, F32: tl.constexpr):
    """``acc + w [BLOCK_N, SUB] @ x^T [SUB, 16]`` on the matrix unit (F32: the operands in
    float32 first, for the Triton interpreter, whose products of bfloat16 are wrong; the
    products are exact either way)."""
    if F32:
        out = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc)
    else:
        out = tl.dot(w, tl.trans(x), acc)
    return out


@triton.jit
def _slice_product(words, x, part, J: tl.constexpr, BITS: tl.constexpr, F16: tl.constexpr,
                   ASM: tl.constexpr, F32: tl.constexpr):
    """``part`` plus slice J's codes as OFFSET + q (see the module docstring) times x: 8-bit
    codes with bfloat16 activations as two products (low nibble 128 + lo, high nibble 2048 +
    16 hi); every other form as one."""
    if BITS == 8 and not F16:
        part = _mma(_field_values(words, J * 8, 4, 0x4300, F16, ASM), x, part, F32)
        part = _mma(_field_values(words, J * 8 + 4, 4, 0x4500, F16, ASM), x, part, F32)
    else:
        MAGIC: tl.constexpr = 0x6400 if F16 else 0x4300
        part = _mma(_field_values(words, J * BITS, BITS, MAGIC, F16, ASM), x, part, F32)
    return part


@triton.jit
def _x_cols(perm_ptr, cols, K, HAS_PERM: tl.constexpr, EVEN: tl.constexpr):
    """The columns of x that hold the weights' columns ``cols`` (the act-order permutation
    when HAS_PERM)."""
    if HAS_PERM and EVEN:
        src = tl.load(perm_ptr + cols)
    elif HAS_PERM:
        src = tl.load(perm_ptr + cols, mask=cols < K, other=0)
    else:
        src = cols
    return src


@triton.jit
def _x_tile(x_rows, src, cols, K, EVEN: tl.constexpr):
    """x's columns ``src`` [SUB] of the 16 rows ``x_rows`` [16, 1] (zeros where ``cols`` is
    past K unless EVEN)."""
    if EVEN:
        x = tl.load(x_rows + src[None, :])
    else:
        x = tl.load(x_rows + src[None, :], mask=(cols < K)[None, :], other=0.0)
    return x


@triton.jit
def _x_row(x_ptr, src, cols, K, EVEN: tl.constexpr):
    """The first row's columns ``src`` [SUB] as float32 (zeros past K unless EVEN)."""
    if EVEN:
        x = tl.load(x_ptr + src)
    else:
        x = tl.load(x_ptr + src, mask=cols < K, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _per_output(ptr, n0, N, BLOCK_N: tl.constexpr, HALVES: tl.constexpr):
    """``ptr[n0 .. n0 + BLOCK_N - 1]`` (outputs past N repeat the last). HALVES: two loads of
    BLOCK_N / 2 joined: Triton loads a vector of fewer elements than the program has threads
    straight into the accumulator's layout, a larger one an element a thread and then moves it
    through shared memory, waiting for the load there."""
    if HALVES:
        r = tl.arange(0, BLOCK_N // 2)
        lo = tl.load(ptr + tl.minimum(n0 + r, N - 1))
        hi = tl.load(ptr + tl.minimum(n0 + BLOCK_N // 2 + r, N - 1))
        v = tl.reshape(tl.permute(tl.join(lo, hi), (1, 0)), (BLOCK_N,))
    else:
        v = tl.load(ptr + tl.minimum(n0 + tl.arange(0, BLOCK_N), N - 1))
    return v


@triton.jit
def _chunk_affine(s_ptr, b_ptr, k0, n_groups, N, n0, GROUP: tl.constexpr,
                  OFFSET: tl.constexpr, BLOCK_N: tl.constexpr, HALVES: tl.constexpr):
    """The scales s and offsets ``c = b - OFFSET s`` [BLOCK_N] of outputs ``n0 ..`` in the group
    holding column ``k0`` (the last group for the padding past K, whose activations are
    zeros)."""
    g = tl.minimum(k0 // GROUP, n_groups - 1) * N
    s, b = _affine_constants(_per_output(s_ptr + g, n0, N, BLOCK_N, HALVES),
                             _per_output(b_ptr + g, n0, N, BLOCK_N, HALVES))
    return s, b - OFFSET * s


@triton.jit
def _prefetch_affine(s_ptr, b_ptr, t_lo, t_hi, n_groups, N, nc, PACK: tl.constexpr,
                     GROUP: tl.constexpr, ON: tl.constexpr):
    """Ask for the scales and biases of the groups of tiles ``t_lo .. t_hi - 1`` to be brought
    into L2 (nothing unless ON): constants of the step, asked for before the loop so that their
    loads at each chunk's start hit L2 (where Triton converts them to the accumulator's layout
    right after loading, the program waits for them there)."""
    if ON:
        g_hi = tl.minimum(tl.cdiv(t_hi * PACK, GROUP), n_groups)
        for g in range((t_lo * PACK) // GROUP, g_hi):
            prefetch_l2(s_ptr + g * N + nc, ON)
            prefetch_l2(b_ptr + g * N + nc, ON)


@triton.jit
def _cols_product(x_ptr, perm_ptr, s_ptr, b_ptr, q_rows, pid_n, pid_k, offs_n, n_ok, nc, t_lo,
                  t_hi, n_groups, N, K, bias_ptr, y_ptr, part_ptr, cnt_ptr, stride_ym, split_k,
                  BITS: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
                  F16: tl.constexpr, OFFSET: tl.constexpr, HAS_PERM: tl.constexpr,
                  HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr,
                  SPLIT: tl.constexpr, ASM: tl.constexpr, F32: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    """XSUM 2, one row: the groups of the program's slice of K in the product's columns. Column
    c of the operand x^T holds the row's activations on the columns of group ``g_lo + c`` and
    zeros elsewhere, so one accumulator [BLOCK_N, BLOCK_M] collects every group's sum
    ``sum_k x_k (OFFSET + q_k)`` apart, through the whole slice with no fold inside the loop;
    the groups' scales and offsets and the row's sums per group come in once, after it
    (:func:`affine_swap` takes this form where a slice spans at most BLOCK_M groups). The
    row's sums per group are added up from the operand's tiles in the loop (~40 of a tile's
    ~400 instructions a thread): read once after the loop instead, the step measured 2-3 %
    slower (an H100, 2026-12-07; docs/benchmarks/quantization.md); x's columns loaded into
    registers before the loop and summed after it, 3-8 % slower (the same card and day); the
    slice's first tile of words loaded into registers before the wait for the previous
    kernel, gate/up 40.9 against 30.6 us alone and the step 17-19 % slower (an H100, later
    that day)."""
    PER: tl.constexpr = 32 // BITS
    PACK: tl.constexpr = PER * SUB
    offs_i = tl.arange(0, SUB)
    cols_c = tl.arange(0, BLOCK_M)
    g_lo = (t_lo * PACK) // GROUP
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    xg = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
    for t in range(t_lo, t_hi):
        words = tl.load(q_rows + t * SUB)
        for j in tl.static_range(PER):
            cols = t * PACK + j * SUB + offs_i
            src = _x_cols(perm_ptr, cols, K, HAS_PERM, EVEN)
            mine = (cols_c == (t * PACK + j * SUB) // GROUP - g_lo)[:, None]
            if EVEN:
                x = tl.load(x_ptr + src[None, :] + cols_c[:, None] * 0, mask=mine, other=0.0)
            else:
                x = tl.load(x_ptr + src[None, :] + cols_c[:, None] * 0,
                            mask=mine & (cols < K)[None, :], other=0.0)
            acc = _slice_product(words, x, acc, j, BITS, F16, ASM, F32)
            xg += x.to(tl.float32)
    xs = tl.sum(xg, axis=1)  # [BLOCK_M]: the row's sum over each group's columns in the slice
    g = g_lo + cols_c
    at = g[None, :] * N + nc[:, None]
    g_ok = (g < n_groups)[None, :]
    s, b = _affine_constants(tl.load(s_ptr + at, mask=g_ok, other=0.0),
                             tl.load(b_ptr + at, mask=g_ok, other=0.0))
    c = b - OFFSET * s
    y = tl.sum(acc * s + xs[None, :] * c, axis=1)  # [BLOCK_N]
    out = tl.broadcast_to(y[:, None], (BLOCK_N, BLOCK_M))
    one = tl.full((1, 1), 1.0, tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    _finish(tl.trans(out), one, one, pid_n, pid_k, offs_m, offs_n, offs_m < 1, n_ok, bias_ptr,
            y_ptr, part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS, BLOCK_M, SPLIT)


@triton.jit
def _affine_swap(x_ptr, q_ptr, s_ptr, b_ptr, perm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
                 M, N, K, stride_xm, stride_qn, stride_ym, split_k,
                 BITS: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
                 F16: tl.constexpr, OFFSET: tl.constexpr, HAS_PERM: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, XSUM: tl.constexpr,
                 ROW1: tl.constexpr, EVEN: tl.constexpr, SPLIT: tl.constexpr,
                 HALVES: tl.constexpr, ASM: tl.constexpr, F32: tl.constexpr,
                 BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    """One program: BLOCK_N outputs of BLOCK_M rows (block ``pid_m``; SPLIT only with one block),
    the packed tiles of slice ``pid_k`` of ``split_k``. A tile is SUB words per output,
    32/BITS slices of SUB columns; slices fold into the accumulator a chunk at a time (CHUNK
    slices inside one group, at most a tile). XSUM 0: row sums from x in registers (ROW1:
    only the first row, as a scalar); 1: from the matrix unit; 2 (one row): the slice's
    groups in the product's columns, no folds in the loop (:func:`_cols_product`). EVEN: K a
    multiple of the tile (no masks on x). Rows past M and outputs past N repeat the last one
    (no masks on loads; never stored). HALVES: the scales load BLOCK_N / 2 at a time
    (:func:`_per_output`; BLOCK_N at least the threads). ASM: compiled for the GPU (inline
    PTX, L2 prefetches); else the interpreter's forms (F32: bfloat16 products in float32).
    (The words' tiles through a tensor descriptor, bulk copies: even in the step at the
    launches their own search chose, slower at these; an H100, 2026-12-07.)"""
    PER: tl.constexpr = 32 // BITS
    PACK: tl.constexpr = PER * SUB
    GS: tl.constexpr = GROUP // SUB
    CHUNK: tl.constexpr = min(GS & -GS, PER)
    DTYPE: tl.constexpr = tl.float16 if F16 else tl.bfloat16
    pdl_trigger(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    nc = tl.minimum(offs_n, N - 1)
    offs_i = tl.arange(0, SUB)
    q_rows = q_ptr + nc.to(tl.int64)[:, None] * stride_qn + offs_i[None, :]
    n_tiles = tl.cdiv(K, PACK)
    n_groups = tl.cdiv(K, GROUP)
    t_lo, t_hi = _slice(n_tiles, pid_k, split_k, 1, SPLIT)
    if PDL:  # the first tile's words (constants of the step) asked into L2, one address a row
        first = tl.minimum(t_lo, n_tiles - 1) * SUB
        prefetch_l2(q_ptr + nc.to(tl.int64) * stride_qn + first, PDL)
    _prefetch_affine(s_ptr, b_ptr, t_lo, t_hi, n_groups, N, nc, PACK, GROUP, ASM)
    pdl_wait(PDL)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    x_rows = x_ptr + tl.minimum(offs_m, M - 1).to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if XSUM == 2:
        _cols_product(x_ptr, perm_ptr, s_ptr, b_ptr, q_rows, pid_n, pid_k, offs_n, n_ok, nc,
                      t_lo, t_hi, n_groups, N, K, bias_ptr, y_ptr, part_ptr, cnt_ptr,
                      stride_ym, split_k, BITS, GROUP, SUB, F16, OFFSET, HAS_PERM, HAS_BIAS,
                      BLOCK_N, EVEN, SPLIT, ASM, F32, BLOCK_M)
        return
    ones = tl.full((BLOCK_N, SUB), 1.0, DTYPE)
    for t in range(t_lo, t_hi):
        words = tl.load(q_rows + t * SUB)
        for j in tl.static_range(PER):
            cols = t * PACK + j * SUB + offs_i
            src = _x_cols(perm_ptr, cols, K, HAS_PERM, EVEN)
            x = _x_tile(x_rows, src, cols, K, EVEN)
            if j % CHUNK == 0:  # the chunk's affine loads here, is used at its end
                s, c = _chunk_affine(s_ptr, b_ptr, t * PACK + j * SUB, n_groups, N,
                                     pid_n * BLOCK_N, GROUP, OFFSET, BLOCK_N, HALVES)
                part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                if XSUM == 1:
                    xp = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                elif ROW1:
                    xv = tl.zeros((SUB,), dtype=tl.float32)
                else:
                    xg = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
            part = _slice_product(words, x, part, j, BITS, F16, ASM, F32)
            if XSUM == 1:
                xp = _mma(ones, x, xp, F32)
            elif ROW1:
                xv += _x_row(x_ptr, src, cols, K, EVEN)
            else:
                xg += x.to(tl.float32)
            if j % CHUNK == CHUNK - 1:
                if XSUM == 1:
                    acc += s[:, None] * part + c[:, None] * xp
                elif ROW1:
                    acc += s[:, None] * part + c[:, None] * tl.sum(xv, axis=0)
                else:
                    acc += s[:, None] * part + c[:, None] * tl.sum(xg, axis=1)[None, :]
    one = tl.full((1, 1), 1.0, tl.float32)
    _finish(tl.trans(acc), one, one, pid_n, pid_k, offs_m, offs_n, offs_m < M, n_ok, bias_ptr,
            y_ptr, part_ptr, cnt_ptr, N, stride_ym, split_k, HAS_BIAS, BLOCK_M, SPLIT)


# ---------------------------------------------------------------- launch configurations

#: (BLOCK_N, SPLIT_K, warps, stages, XSUM) by (:func:`shape_class`, :func:`rows_bucket`),
#: chosen on an H200 by ``benchmarks/swap_affine_gpu.py --search`` (Llama-3-8B's layers, int4
#: in groups of 128; the launch with the least summed time over the class's layers); the
#: one-row launches (the groups in the product's columns, XSUM 2) by the same search on an
#: H100.
CONFIGS = {("deep", 1): (128, 8, 4, 5, 2), ("deep", 4): (128, 8, 8, 3, 0),
           ("deep", 16): (128, 8, 4, 5, 0), ("deep", 32): (128, 8, 4, 3, 0),
           ("deep", 64): (128, 8, 4, 3, 0), ("deep", 128): (128, 4, 8, 3, 0),
           ("square", 1): (128, 8, 4, 2, 2), ("square", 4): (128, 8, 4, 2, 0),
           ("square", 16): (128, 8, 4, 2, 0), ("square", 32): (64, 4, 4, 3, 0),
           ("square", 64): (64, 4, 4, 2, 0), ("square", 128): (64, 4, 4, 2, 0),
           ("wide", 1): (64, 1, 4, 2, 2), ("wide", 4): (128, 4, 4, 3, 0),
           ("wide", 16): (128, 1, 4, 5, 0), ("wide", 32): (128, 1, 4, 3, 0),
           ("wide", 64): (128, 4, 4, 3, 0), ("wide", 128): (128, 2, 8, 3, 0)}


def _class_rows(name: str) -> tuple[str, int]:
    cls, _, rows = name.partition(":")
    return cls, int(rows)


def _launch_overrides(spec: str) -> dict:
    """``CLASS:ROWS=BLOCK_N,SPLIT_K,warps,stages,XSUM`` entries separated by ``;`` (e.g.
    ``wide:1=128,2,4,3,2``) as :data:`CONFIGS` keys and launches (A/B runs of launches found
    by ``benchmarks/swap_affine_gpu.py --search``)."""
    return launch_spec(spec, "ENGINE_AFFINE_LAUNCHES",
                       "CLASS:ROWS=BLOCK_N,SPLIT_K,warps,stages,XSUM", _class_rows, sep="=")


#: (``ENGINE_AFFINE_LAUNCHES``: entries of the table replaced for an A/B, e.g. on another GPU)
CONFIGS.update(_launch_overrides(os.environ.get("ENGINE_AFFINE_LAUNCHES", "")))

#: row buckets of the launch table (up to 1, 4, 16, 32, 64 rows; more: MAX_ROWS a program)
BUCKETS = (1, 4, 16, 32, 64, MAX_ROWS)


def rows_bucket(m: int) -> int:
    """The launch table's row bucket of ``m`` rows: the least of :data:`BUCKETS` holding ``m``
    (:data:`MAX_ROWS` for any more)."""
    return next((b for b in BUCKETS if m <= b), MAX_ROWS)


def rows_block(m: int) -> int:
    """Rows of one program for ``m`` rows: 16 up to 16 (the matrix unit's narrowest side), then
    the bucket."""
    return max(16, rows_bucket(m))


def operand_rows(m: int, xsum: int) -> int:
    """Rows of the activation operand a program of ``m`` rows stages at XSUM ``xsum``: eight
    for one row with the groups in eight columns (XSUM 3), else :func:`rows_block`."""
    return 8 if xsum == 3 and m == 1 else rows_block(m)


@functools.lru_cache(maxsize=None)
def _cols_split(k: int, pack: int, group: int, split: int, cols: int) -> int | None:
    """The least split of K, from ``split`` up, whose every slice (whole tiles of ``pack``
    columns, as the kernel cuts them) spans at most ``cols`` groups; None past the tiles."""
    tiles = triton.cdiv(k, pack)
    for s in range(max(split, 1), tiles + 1):
        steps = triton.cdiv(tiles, s)
        widest = 0
        for p in range(s):
            lo = p * steps * pack
            hi = min(tiles * pack, lo + steps * pack)
            if lo < hi:
                widest = max(widest, (hi - 1) // group - lo // group + 1)
        if widest <= cols:
            return s
    return None


def default_config(n: int, k: int, m: int) -> tuple:
    """The launch :data:`CONFIGS` gives ``m`` rows of a weight [n, k]."""
    return CONFIGS[(shape_class(n, k), rows_bucket(m))]


def code_offset(bits: int, dtype: torch.dtype) -> int:
    """OFFSET of the module docstring: the constant the 16-bit code values add to q."""
    if dtype == torch.float16:
        return 1024
    return 2176 if bits == 8 else 128


def affine_swap(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias_: torch.Tensor,
                bits: int, group: int, sub: int, perm: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, config: tuple | None = None) -> torch.Tensor:
    """:func:`engine.runtime.quant_triton.affine_mm` for bfloat16 or float16 ``x`` [M, K]
    (:data:`MAX_ROWS` rows a program): ``q`` from :func:`engine.runtime.quant_triton.pack_affine`
    (``bits`` 2, 4 or 8, slices of ``sub`` columns), ``scale``/``bias_`` [K / group, N] as
    ``affine_mm`` takes them (float32, or the 16-bit compact form),
    ``perm`` the act-order permutation of K (int32), ``bias`` [N]. The weights multiply as
    their float32 values (not rounded to x's dtype). ``config``: (BLOCK_N, SPLIT_K, warps,
    stages, XSUM), else :data:`CONFIGS`'."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"affine_swap takes bfloat16 or float16 activations, got {x.dtype}")
    if bits not in (2, 4, 8) or sub not in (16, 32) or group % sub:
        raise ValueError(f"unsupported packing: bits={bits} group={group} sub={sub}")
    n = q.shape[0]
    pack = 32 // bits * sub
    if q.shape[1] != triton.cdiv(k, pack) * sub:
        raise ValueError(f"codes of {q.shape[1]} words a row do not pack {k} columns of "
                         f"{bits} bits in slices of {sub}")
    bn, split, warps, stages, xsum = config or default_config(n, k, m)
    scale = scale.contiguous()
    bias_ = bias_.contiguous()
    bm = rows_block(m)
    blocks = triton.cdiv(m, bm)
    split = 1 if blocks > 1 else _split(min(split, triton.cdiv(k, pack)), n, bn, bm)
    if xsum >= 2:  # (one row, slices of at most BLOCK_M groups, 16 or (XSUM 3) 8 columns;
        # else the folds in registers)
        cols = operand_rows(m, xsum)
        cols_split = _cols_split(k, pack, group, split, cols) if m == 1 else None
        if cols_split and _split(cols_split, n, bn, cols) == cols_split:
            split, bm, xsum = cols_split, cols, 2
        else:
            xsum = 0
    part, cnt = _workspace(x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    interpret = _interpreting()
    f16 = x.dtype == torch.float16
    grid = (triton.cdiv(n, bn), split, blocks)
    _affine_swap[grid](x, q, scale, bias_, perm if perm is not None else q,
                       bias if bias is not None else y, y, part, cnt, m, n, k, x.stride(0),
                       q.stride(0), y.stride(0), split, BITS=bits, GROUP=group, SUB=sub,
                       F16=f16, OFFSET=float(code_offset(bits, x.dtype)),
                       HAS_PERM=perm is not None, HAS_BIAS=bias is not None, BLOCK_N=bn,
                       XSUM=xsum, ROW1=m == 1, EVEN=k % pack == 0, SPLIT=split > 1,
                       HALVES=bn >= 32 * warps,
                       ASM=not interpret and hasattr(triton, "constexpr_function"),
                       F32=interpret and not f16, BLOCK_M=bm, num_warps=warps, num_stages=stages,
                       **launch_options(x.device))
    return y
