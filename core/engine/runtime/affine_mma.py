"""One row of 4-bit weight-only products on the matrix unit from registers, in Gluon.

:func:`affine_mma` computes :func:`engine.runtime.quant_triton.affine_mm` for one row of
bfloat16 or float16 activations and 4-bit codes in the canonical packed form of
:func:`engine.runtime.quant_triton.pack_affine` (slices of 32 columns: the int32 word at
column ``i`` of tile ``t`` of a row holds the codes of columns ``256 t + 32 p + i``, nibble
``p``), with synchronous matrix instructions (``mma.sync`` m16n8k16) whose operands both live
in registers: no shared memory on the product's path, no barrier, each warp on its own.

The weight operand. A thread loads eight neighbouring words of a row (two 16-byte loads). Two
neighbouring words a, b become eight registers of two 16-bit floats with two byte permutes
(their low halves side by side, their high halves side by side) and, per register, a shift and
one three-input logic operation: register p holds nibble p of a and of b or'ed into the
mantissa of a power of two (``0x4300 | q`` = 128 + q as bfloat16, ``0x6400 | q`` = 1024 + q as
float16), two weights of neighbouring columns, exactly the pair of neighbouring K a thread of
the matrix instruction holds in one register. The order of K inside the product is free (the
sum does not depend on it), so the product's K is laid out to make those registers its operand
as they are made: one Gluon layout for the loaded words, joins and a reshape that the compiler
proves free (``convert_layout(..., assert_trivial=True)``).

The activation operand holds x in its natural order, so it loads straight from x (16 bytes a
load). Its 8 columns carry the groups of a chunk of K: column c holds x on the columns of the
chunk's c-th group and zeros elsewhere, so one accumulator keeps each group's sum
``sum_k x_k (OFFSET + q_k)`` apart, and a group's scale and offset ``c = b - OFFSET s`` come in
once at the chunk's end with the row's sums over its groups::

    sum_k x_k w_k = s * product + c * sum_k x_k

The packed words of the D tiles after the current one are in flight a warp, in registers (the
loop unrolled D times, so no register is copied; read through L2 only with CG), x's next tile
too with XA, and a chunk's scales, offsets and x sums are asked for a chunk ahead. Or (S
stages) the words come by asynchronous copies into S stages of shared memory, S - 1 tiles in
flight a warp without their registers; each thread reads back only what its own copies
wrote. With
``split > 1`` each of that many programs of an output block takes a slice of whole chunks, and
the last to finish adds the slices up (:func:`engine.runtime.quant_triton._finish`'s scheme).
Measured against the shipped one-row route on an H100 it is even per layer and slower in the
step (docs/benchmarks/quantization.md), so :func:`engine.runtime.quant_triton.affine_mm` takes
it only with ``ENGINE_AFFINE_MMA=1``.

Gluon kernels do not run under the Triton interpreter: the CPU tests check the index maps
(:func:`logical_columns`) and build the kernel for sm_90; the GPU tests check it against the
float32 product.
"""

from __future__ import annotations

import os

import torch
import triton

from engine.runtime.quant_triton import _split, _workspace
from engine.runtime.triton_pdl import launch_options, pdl_trigger, pdl_wait

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    #: the block-wide barrier (``thread_barrier`` up to Triton 3.6, ``barrier`` later)
    _barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    #: the asynchronous copy into shared memory (``async_copy_global_to_shared`` up to Triton
    #: 3.6, ``async_load`` later)
    _async_load = (getattr(async_copy, "async_load", None)
                   or async_copy.async_copy_global_to_shared)
except ImportError:  # a Triton without Gluon: nothing here launches
    gluon = gl = async_copy = mma_v2 = _barrier = _async_load = None

#: columns of a packed tile (32 words of eight 4-bit codes a row)
TILE = 256
#: stages of shared memory the default launch passes the words through (0: none, the words
#: in registers; ``ENGINE_AFFINE_MMA_STAGES``, for A/B runs)
STAGES = int(os.environ.get("ENGINE_AFFINE_MMA_STAGES", "0"))


def available() -> bool:
    """Whether this Triton has Gluon (the module's kernel can be built)."""
    return gluon is not None


def logical_columns() -> torch.Tensor:
    """int64 [256]: the tile's column that the product's K index ``j`` of a tile stands for, in
    the kernel's order (``j = 32 p + 16 ks0 + 8 kb3 + 2 km + kb0`` holds column ``32 p + 8 km
    + 4 ks0 + 2 kb3 + kb0``). A permutation of 0..255, the same for both operands."""
    j = torch.arange(TILE)
    p, ks0, kb3, km, kb0 = j // 32, (j // 16) % 2, (j // 8) % 2, (j // 2) % 4, j % 2
    return 32 * p + 8 * km + 4 * ks0 + 2 * kb3 + kb0


if gluon is None:
    mma_layout = words_layout = None
else:
    @gluon.constexpr_function
    def _pair_asm(magic):
        """Two neighbouring words a, b -> eight registers, register p = nibble p of a (low
        half) and of b (high half), each ``magic | code``."""
        m = f"{magic * 0x10001:#x}"
        lines = ["prmt.b32 lo, $8, $9, 0x5410;", "prmt.b32 hi, $8, $9, 0x7632;"]
        for p in range(8):
            src = "lo" if p < 4 else "hi"
            if p % 4:
                lines.append(f"shr.u32 u, {src}, {4 * (p % 4)};")
                src = "u"
            lines.append(f"lop3.b32 ${p}, {src}, 0x000f000f, {m}, 0xea;")
        return "{ .reg .b32 lo, hi, u; " + " ".join(lines) + " }"

    @gluon.constexpr_function
    def mma_layout(warps):
        """The accumulator's layout of ``mma.sync`` m16n8k16 with the warps over its rows (the
        operands': ``gl.DotOperandLayout(0 | 1, it, 2)``)."""
        return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[warps, 1],
                                         instr_shape=[16, 8])

    @gluon.constexpr_function
    def words_layout(warps, mr):
        """[16 warps mr rows, 4 (km), 8 (word of the thread)]: the words a thread loads are its
        rows' neighbouring words km * 8 .. km * 8 + 7 (two 16-byte loads)."""
        reg = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [8, 0, 0]]
        reg += [[16 * warps * (1 << i), 0, 0] for i in range(mr.bit_length() - 1)]
        lane = [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
        warp = [[16 * (1 << i), 0, 0] for i in range(warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [16 * warps * mr, 4, 8])

    @gluon.constexpr_function
    def _rows_layout(warps, mr):
        """[16 warps mr rows, 32 words]: :func:`words_layout` with its last two dimensions as
        one (the layout of the copies into shared memory and of the reads back)."""
        words = words_layout(warps, mr)

        def flat(bases):
            return [[row, 8 * km + word] for row, km, word in bases]

        return gl.DistributedLinearLayout(flat(words.reg_bases), flat(words.lane_bases),
                                          flat(words.warp_bases), [], [words.shape[0], 32])

    @gluon.constexpr_function
    def _x_layout(warps):
        """[8 (nibble p), 32 (word column i), 8 (group column c)]: a thread's x values of a
        tile, 8 neighbouring columns a load, as the activation operand holds them."""
        reg = [[0, 1, 0], [0, 2, 0], [0, 4, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
        lane = [[0, 8, 0], [0, 16, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]]
        warp = [[0, 0, 0]] * (warps.bit_length() - 1)
        return gl.DistributedLinearLayout(reg, lane, warp, [], [8, 32, 8])

    @gluon.constexpr_function
    def _sums_layout(warps, group):
        """[8 (group column c), GROUP]: the row's x over a chunk's groups, each group's columns
        spread over a warp's lanes as the accumulator spreads its columns (every warp loads them
        all), so their sums need no shared memory."""
        per = group // 8
        reg = [[0, 1 << i] for i in range(per.bit_length() - 1)] + [[1, 0]]
        lane = [[2, 0], [4, 0], [0, per], [0, 2 * per], [0, 4 * per]]
        warp = [[0, 0]] * (warps.bit_length() - 1)
        return gl.DistributedLinearLayout(reg, lane, warp, [], [8, group])

    @gluon.jit
    def _a_operand(w, MAGIC: gl.constexpr, F16: gl.constexpr, A: gl.constexpr):
        """The words [BN, 4, 8] of a tile -> the weight operand [BN, 256] (K in the order of
        :func:`logical_columns`)."""
        ASM: gl.constexpr = _pair_asm(MAGIC)
        if F16:
            o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
                ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w],
                dtype=(gl.float16, gl.float16, gl.float16, gl.float16, gl.float16,
                       gl.float16, gl.float16, gl.float16), is_pure=True, pack=2)
        else:
            o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
                ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w],
                dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16,
                       gl.bfloat16, gl.bfloat16, gl.bfloat16), is_pure=True, pack=2)
        j0 = gl.join(gl.join(gl.join(o0, o1), gl.join(o2, o3)),
                     gl.join(gl.join(o4, o5), gl.join(o6, o7)))  # [BN, km, word, p0, p1, p2]
        BN: gl.constexpr = w.shape[0]
        j1 = gl.reshape(j0, (BN, 4, 2, 2, 2, 2, 2, 2))  # [BN, km, ks0, kb3, kb0, p0, p1, p2]
        j = gl.reshape(gl.permute(j1, (0, 7, 6, 5, 2, 3, 1, 4)), (BN, 256))
        return gl.convert_layout(j, A, assert_trivial=True)

    @gluon.jit
    def _b_operand(x_ptr, x_offs, nib32, cols, t, c0, live, GROUP: gl.constexpr,
                   B: gl.constexpr):
        """x's columns of tile t as the activation operand [256, 8]: column c holds the chunk's
        group c (the chunk starting at tile c0), zeros elsewhere (all zeros unless ``live``)."""
        g = (t * 256 + nib32) // GROUP - (c0 * 256) // GROUP  # [8, 1, 1]
        xt = gl.load(x_ptr + t * 256 + x_offs, mask=(g == cols) & live, other=0.0)
        x6 = gl.reshape(xt, (8, 4, 2, 2, 2, 8))  # p, km, ks0, kb3, kb0, c
        x2 = gl.reshape(gl.permute(x6, (0, 2, 3, 1, 4, 5)), (256, 8))
        return gl.convert_layout(x2, B, assert_trivial=True)

    @gluon.jit
    def _chunk_constants(s_ptr, b_ptr, x_ptr, g0, n_groups, N, rows, cm, gi, gj,
                         GPC: gl.constexpr, GROUP: gl.constexpr, OFFSET: gl.constexpr):
        """The scales s and offsets ``c = b - OFFSET s`` [BN, 8] of the chunk's groups ``g0 ..
        g0 + GPC - 1`` (zeros past them and past the weight) and the row's sums of x over them
        [8], in the accumulator's layout."""
        g = g0 + cm
        g_ok = (cm < GPC) & (g < n_groups)
        at = g[None, :] * N + rows[:, None]
        s = gl.load(s_ptr + at, mask=g_ok[None, :], other=0.0).to(gl.float32)
        b = gl.load(b_ptr + at, mask=g_ok[None, :], other=0.0).to(gl.float32)
        # (quant_triton._affine_constants' rule, which a Gluon kernel cannot call: the
        # compact form stores b / s)
        if b_ptr.dtype.element_ty != gl.float32:
            b = b * s
        c = b - OFFSET * s
        xg_ok = (gi < GPC) & (g0 + gi < n_groups)
        xg = gl.load(x_ptr + (g0 + gi)[:, None] * GROUP + gj[None, :], mask=xg_ok[:, None],
                     other=0.0).to(gl.float32)
        xs = gl.convert_layout(gl.sum(xg, axis=1), cm.type.layout, assert_trivial=True)
        return s, c, xs

    @gluon.jit
    def _copy_words(buf, q_tiles, t, last, S: gl.constexpr, WCACHE: gl.constexpr):
        """Ask for tile ``min(t, last)``'s words into stage ``t % S`` of ``buf`` (one group of
        asynchronous copies)."""
        _async_load(buf.index(t % S), q_tiles + gl.minimum(t, last) * 32,
                    cache_modifier=WCACHE)
        async_copy.commit_group()

    @gluon.jit
    def _staged_words(buf, q_tiles, t, last, S: gl.constexpr, WCACHE: gl.constexpr,
                      WL: gl.constexpr):
        """Tile t's words [BN, 4, 8] from stage ``t % S`` once their copies have landed, the
        copies of tile ``t + S - 1`` asked for into the stage read a tile ago. Each thread reads
        back only what its own copies wrote, so waiting for its own copies would be enough;
        Triton's lowering of the wait adds a block barrier all the same."""
        async_copy.wait_group(S - 2)
        RL: gl.constexpr = q_tiles.type.layout
        w2 = buf.index(t % S).load(RL)
        _copy_words(buf, q_tiles, t + S - 1, last, S, WCACHE)
        BN: gl.constexpr = w2.shape[0]
        return gl.convert_layout(gl.reshape(w2, (BN, 4, 8)), WL, assert_trivial=True)

    @gluon.jit
    def _affine_mma(x_ptr, q_ptr, s_ptr, b_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, N, K,
                    stride_qn, split_k, GROUP: gl.constexpr, CT: gl.constexpr,
                    F16: gl.constexpr, HAS_BIAS: gl.constexpr, MR: gl.constexpr,
                    D: gl.constexpr, XA: gl.constexpr, WCACHE: gl.constexpr,
                    S: gl.constexpr, SPLIT: gl.constexpr, PDL: gl.constexpr):
        """One program: 16 * warps * MR outputs, slice ``pid_k`` of ``split_k`` (whole chunks
        of CT tiles of 256 columns; a chunk spans at most 8 groups). D: tiles of words in
        flight a warp in registers (1-4); XA: x's tile a tile ahead; WCACHE: the words' cache
        modifier; S > 0 (2, 4 or 8; D 1): the words come through S stages of shared memory
        instead, S - 1 tiles of asynchronous copies in flight a warp."""
        W: gl.constexpr = gl.num_warps()
        BN: gl.constexpr = 16 * W * MR
        GPC: gl.constexpr = CT * 256 // GROUP  # groups a chunk
        MAGIC: gl.constexpr = 0x6400 if F16 else 0x4300
        OFFSET: gl.constexpr = 1024.0 if F16 else 128.0
        MMA: gl.constexpr = mma_layout(W)
        A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
        WL: gl.constexpr = words_layout(W, MR)
        XL: gl.constexpr = _x_layout(W)
        GL: gl.constexpr = _sums_layout(W, GROUP)
        pdl_trigger(PDL)
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n_tiles = K // 256
        per = gl.cdiv(gl.cdiv(n_tiles, CT), split_k) * CT
        t_lo = pid_k * per
        t_hi = gl.minimum(n_tiles, t_lo + per)
        t_first = gl.minimum(t_lo, n_tiles - 1)
        rn = gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, WL)))
        rkm = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL)))
        rw = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL)))
        rows = gl.minimum(pid_n * BN + rn, N - 1).to(gl.int64) * stride_qn
        q_rows = q_ptr + rows[:, None, None] + (rkm * 8)[None, :, None] + rw[None, None, :]
        xn = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, XL)))
        xi = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, XL)))
        xc = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, XL)))
        x_offs = (32 * xn)[:, None, None] + xi[None, :, None] + 0 * xc[None, None, :]
        nib32 = (32 * xn)[:, None, None]
        cols = xc[None, None, :]
        rn_m = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        rn_c = gl.minimum(rn_m, N - 1)
        cm = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
        gi = gl.arange(0, 8, layout=gl.SliceLayout(1, GL))
        gj = gl.arange(0, GROUP, layout=gl.SliceLayout(0, GL))
        n_groups = K // GROUP
        last = gl.maximum(t_hi - 1, t_first)
        if S > 0:
            RL: gl.constexpr = _rows_layout(W, MR)
            buf = gl.allocate_shared_memory(gl.int32, [S, BN, 32],
                                            gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))
            r2 = gl.arange(0, BN, layout=gl.SliceLayout(1, RL))
            c2 = gl.arange(0, 32, layout=gl.SliceLayout(0, RL))
            rows2 = gl.minimum(pid_n * BN + r2, N - 1).to(gl.int64) * stride_qn
            q_tiles = q_ptr + rows2[:, None] + c2[None, :]
            for i in gl.static_range(S - 1):
                _copy_words(buf, q_tiles, t_lo + i, last, S, WCACHE)
        else:
            w0 = gl.load(q_rows + t_first * 32, cache_modifier=WCACHE)
        if D > 1:
            w1 = gl.load(q_rows + gl.minimum(t_first + 1, last) * 32, cache_modifier=WCACHE)
        if D > 2:
            w2 = gl.load(q_rows + gl.minimum(t_first + 2, last) * 32, cache_modifier=WCACHE)
        if D > 3:
            w3 = gl.load(q_rows + gl.minimum(t_first + 3, last) * 32, cache_modifier=WCACHE)
        pdl_wait(PDL)
        s_c, c_c, xs_c = _chunk_constants(s_ptr, b_ptr, x_ptr, t_lo * 256 // GROUP, n_groups, N,
                                          rn_c, cm, gi, gj, GPC, GROUP, OFFSET)
        y = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, MMA))
        acc = gl.zeros([BN, 8], gl.float32, layout=MMA)
        if XA:  # x's tile a tile ahead
            xa = _b_operand(x_ptr, x_offs, nib32, cols, t_first, t_first, t_lo < t_hi, GROUP, B)
        for t0 in range(t_lo, t_hi, D):
            for j in gl.static_range(D):
                t = t0 + j
                nxt = gl.minimum(t + D, last)
                if S > 0:
                    w = _staged_words(buf, q_tiles, t, last, S, WCACHE, WL)
                elif j == 0:
                    w = w0
                    w0 = gl.load(q_rows + nxt * 32, cache_modifier=WCACHE)
                elif j == 1:
                    w = w1
                    w1 = gl.load(q_rows + nxt * 32, cache_modifier=WCACHE)
                elif j == 2:
                    w = w2
                    w2 = gl.load(q_rows + nxt * 32, cache_modifier=WCACHE)
                else:
                    w = w3
                    w3 = gl.load(q_rows + nxt * 32, cache_modifier=WCACHE)
                c0 = t_lo + ((t - t_lo) // CT) * CT
                if XA:
                    xt = xa
                    c1 = t_lo + ((t + 1 - t_lo) // CT) * CT
                    xa = _b_operand(x_ptr, x_offs, nib32, cols, gl.minimum(t + 1, last), c1,
                                    t + 1 < t_hi, GROUP, B)
                else:
                    xt = _b_operand(x_ptr, x_offs, nib32, cols, gl.minimum(t, last), c0,
                                    t < t_hi, GROUP, B)
                acc = mma_v2(_a_operand(w, MAGIC, F16, A), xt, acc)
                if t < t_hi and ((t - t_lo) % CT == CT - 1 or t == t_hi - 1):
                    # the chunk's groups fold in; the next chunk's constants are asked for
                    y += gl.sum(acc * s_c + c_c * xs_c[None, :], axis=1)
                    acc = gl.zeros([BN, 8], gl.float32, layout=MMA)
                    s_c, c_c, xs_c = _chunk_constants(
                        s_ptr, b_ptr, x_ptr, (c0 + CT) * 256 // GROUP, n_groups, N, rn_c, cm,
                        gi, gj, GPC, GROUP, OFFSET)
        n_ok = rn_m < N
        if SPLIT:
            gl.store(part_ptr + pid_k * N + rn_m, y, mask=n_ok)
            _barrier()  # every thread's partials issued before the release below
            arrived = gl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
            if arrived == split_k - 1:
                total = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, MMA))
                for p in range(split_k):
                    total += gl.load(part_ptr + p * N + rn_m, mask=n_ok, other=0.0,
                                     cache_modifier=".cg")
                if HAS_BIAS:
                    total += gl.load(bias_ptr + rn_m, mask=n_ok, other=0.0).to(gl.float32)
                gl.store(y_ptr + rn_m, total.to(y_ptr.dtype.element_ty), mask=n_ok)
                gl.atomic_xchg(cnt_ptr + pid_n, 0)
        else:
            if HAS_BIAS:
                y += gl.load(bias_ptr + rn_m, mask=n_ok, other=0.0).to(gl.float32)
            gl.store(y_ptr + rn_m, y.to(y_ptr.dtype.element_ty), mask=n_ok)


def supported(x: torch.Tensor, bits: int, group: int, sub: int, k: int) -> bool:
    """Whether :func:`affine_mma` serves this product: one row of bfloat16 or float16 on a GPU
    with the 16-bit matrix instruction (sm_80 or later), 4-bit codes in slices of 32, groups
    of 32-256 columns, K whole tiles of 256, and a Triton with Gluon."""
    return (gluon is not None and x.is_cuda and x.shape[0] == 1
            and x.dtype in (torch.bfloat16, torch.float16) and bits == 4 and sub == 32
            and group in (32, 64, 128, 256) and k % TILE == 0
            and torch.cuda.get_device_capability(x.device)[0] >= 8
            and os.environ.get("TRITON_INTERPRET") != "1")


def default_config(n: int, k: int, group: int) -> tuple[int, ...]:
    """(MR, warps, CT, split, D, XA, CG, S) for a weight [n, k]: chunks of 8 groups, the
    split that gives the grid about two programs a multiprocessor's worth (at most the chunks),
    D tiles of words in flight a warp in registers, x's tile a tile ahead (XA), the words read
    through L2 only (CG), no stages of shared memory (S 0; :data:`STAGES` stages at D 1
    when set)."""
    mr, warps, depth = 1, 4, 2
    ct = 8 * group // TILE
    blocks = triton.cdiv(n, 16 * warps * mr)
    chunks = triton.cdiv(k // TILE, ct)
    split = max(1, min(chunks, triton.cdiv(512, blocks)))
    if STAGES:
        return mr, warps, ct, split, 1, 1, 1, STAGES
    return mr, warps, ct, split, depth, 1, 1, 0


def affine_mma(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias_: torch.Tensor,
               group: int, bias: torch.Tensor | None = None,
               config: tuple[int, ...] | None = None) -> torch.Tensor:
    """``x`` [1, K] @ W^T for 4-bit codes ``q`` [N, K / 256 * 32] packed by
    :func:`engine.runtime.quant_triton.pack_affine` (slices of 32), ``scale``/``bias_`` [K /
    group, N] as ``affine_mm`` takes them (float32, or the 16-bit compact form; see
    :func:`supported`). ``config``: (MR, warps, CT, split, D[, XA, CG, S]);
    the fields it leaves out are :func:`default_config`'s."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    k = x.shape[1]
    n = q.shape[0]
    if q.shape[1] != k // TILE * 32:
        raise ValueError(f"codes of {q.shape[1]} words a row do not pack {k} columns")
    mr, warps, ct, split, depth, xa, cg, stages = (tuple(config or ()) + default_config(
        n, k, group)[len(config or ()):])
    if stages not in (0, 2, 4, 8) or (stages and depth != 1):
        raise ValueError(f"stages {stages} with depth {depth}: 0 (words in registers, depth "
                         "1-4) or 2, 4 or 8 stages of shared memory at depth 1")
    if ct < 1 or ct * TILE > 8 * group or (ct * TILE) % group:
        raise ValueError(f"a chunk of {ct} tiles does not hold whole groups of {group} (<= 8)")
    bn = 16 * warps * mr
    split = _split(max(1, min(split, triton.cdiv(k // TILE, ct))), n, bn, 1)
    part, cnt = _workspace(x.device)
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _affine_mma[(triton.cdiv(n, bn), split)](
        x, q, scale, bias_, bias if bias is not None else y, y, part, cnt, n, k, q.stride(0),
        split, GROUP=group, CT=ct, F16=x.dtype == torch.float16, HAS_BIAS=bias is not None,
        MR=mr, D=depth, XA=bool(xa), WCACHE=".cg" if cg else "", S=stages, SPLIT=split > 1,
        num_warps=warps, **launch_options(x.device))
    return y
