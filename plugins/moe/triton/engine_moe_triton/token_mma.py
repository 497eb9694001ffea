"""One token's expert projections on the matrix unit from registers (Gluon; opt-in).

:func:`down_mma` computes ``out[p] = wts[p] * w2[ids[p]] @ act[p]`` for each (token, slot)
pair's activation row, and :func:`up_mma` that row, ``act[p] = silu(gate) * up`` of
``w13[ids[p]] @ x``, both with ``mma.sync`` m16n8k16 and both operands in registers as
loaded: a thread's two 16-byte loads of weights (rows g and g + 8 of a 16-row block, elements
8 t .. 8 t + 7 of a 32-column chunk: ``words_layout``) are the weight operand once the chunk's
K is taken in the matching order (logical column 16 s + 8 h + 2 t + e is column
8 t + 4 s + 2 h + e; the sum does not depend on the order), and the same order makes a
thread's one 16-byte load of the input row its column of the other operand. So a weight costs
about one instruction, where the CUDA-core form widens it and multiplies it separately.

The warps split K: warp q takes the q-th of ``warps`` slices of K for all of the program's
16 MR rows. Its accumulator row 16 q + r (of a 16-row block) is row r over slice q, and the
input operand's column c holds slice c, so the wanted sums are the accumulator's columns q
(the other columns' products are dropped), and a row's slices meet once, across the warps,
at the end. The chunks are unrolled, so every load of a program may go out at once. A -1 id
(another rank's expert) gives zeros; the weights' loads use expert 0's rows then, so no
branch delays them.

The up projection's MR blocks are half gate rows and half the same features' up rows, so a
thread holds a feature's gate and up sums in the same place of two blocks: each is rounded
as a stored gate/up row is, and their ``silu(gate) * up`` rounded again is the stored
activation (the up projection's GLU form in ``kernels``, computed the same way).

Gluon kernels do not run under the Triton interpreter: the CPU tests build these for sm_90
(tests/runtime/test_sm90_compile.py), the GPU checks (tests/moe/token_moe_checks.py) compare
them with the pair launches and the float32 definition.
"""

from __future__ import annotations

import torch

from engine.api.triton import (launch_options, mma_layout, pdl_trigger, pdl_wait,
                               prefetch_l2, words_layout)

from .kernels import glu_up

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
except ImportError:  # a Triton without Gluon: nothing here launches
    gluon = gl = mma_v2 = None


def available() -> bool:
    """Whether this Triton has Gluon (the kernels can be built)."""
    return gluon is not None


def fits(rows: int, k: int, mr: int, warps: int, prefetch: int = 1) -> bool:
    """Whether a launch of ``mr`` blocks of 16 rows a program and ``warps`` warps (and any
    ``prefetch``) serves a product of ``rows`` outputs over ``k`` inputs (whole blocks, each
    warp's slice of K whole 32-column chunks; the up projection's rows are its 2 I gate and
    up rows, and it also needs ``mr`` even)."""
    return rows % (16 * mr) == 0 and k % (32 * warps) == 0


if gluon is not None:
    @gluon.constexpr_function
    def _act_layout(warps):
        """[4 (t), 8 (neighbouring columns), 8 (the operand's column, the lane's group)]: a
        lane's 8 inputs of a chunk, one 16-byte load, as the input operand holds them (every
        warp loads all the columns)."""
        reg = [[0, 1, 0], [0, 2, 0], [0, 4, 0]]
        lane = [[1, 0, 0], [2, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]]
        warp = [[0, 0, 0]] * (warps.bit_length() - 1)
        return gl.DistributedLinearLayout(reg, lane, warp, [], [4, 8, 8])

    @gluon.constexpr_function
    def _rows_of(warps, mr):
        """The layout of the accumulator rows' index vector (:func:`_sliced_product`'s
        ``w_row``)."""
        return gl.SliceLayout(1, gl.SliceLayout(2, words_layout(warps, mr)))

    @gluon.jit
    def _sliced_product(w_ptr, row, stride_wn, x_row, SL: gl.constexpr, MR: gl.constexpr,
                        EVICT: gl.constexpr, PF: gl.constexpr):
        """[MR, 16] float32: the rows ``row`` of ``w_ptr`` (an expert's weights; [16 W MR] row
        indices in the layout of :func:`_rows_of`, accumulator row 16 q + 16 W m + r taking
        warp q's slice) times the input row ``x_row`` over SL columns a warp, the warps'
        slices summed. PF: the weights' lines past the first chunk pair asked into L2
        first."""
        W: gl.constexpr = gl.num_warps()
        BN: gl.constexpr = 16 * W * MR
        MMA: gl.constexpr = mma_layout(W)
        A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
        WL: gl.constexpr = words_layout(W, MR)
        XL: gl.constexpr = _act_layout(W)
        rt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL)))
        re = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL)))
        rv = gl.arange(0, BN, layout=_rows_of(W, MR))
        w_row = w_ptr + row.to(gl.int64) * stride_wn + (rv // 16) % W * SL
        w_p = w_row[:, None, None] + (rt * 8)[None, :, None] + re[None, None, :]
        xt = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, XL)))
        xe = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, XL)))
        xn = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, XL)))
        x_p = (x_row + (xt * 8)[:, None, None] + xe[None, :, None]
               + (gl.minimum(xn, W - 1) * SL)[None, None, :])
        mine = (xn < W)[None, None, :]
        acc = gl.zeros((BN, 8), gl.float32, MMA)
        # ptxas issues each chunk's loads next to its products (whatever the source order), so
        # a warp would wait for its chunks one after another from memory: the lines of the
        # chunks after the first two (a 128-byte line holds two chunks of a row) are asked into
        # L2 first (a prefetch holds no register, so it stays where it is written)
        for c in gl.static_range(2, SL // 32 if PF else 0, 2):
            prefetch_l2(w_row + 32 * c, True)
        for c in gl.static_range(SL // 32):
            w = gl.reshape(gl.load(w_p + 32 * c, eviction_policy=EVICT), (BN, 4, 2, 2, 2))
            a = gl.convert_layout(gl.reshape(gl.permute(w, (0, 2, 3, 1, 4)), (BN, 32)), A,
                                  assert_trivial=True)  # row, (s, h, t, e)
            x = gl.reshape(gl.load(x_p + 32 * c, mask=mine, other=0.0), (4, 2, 2, 2, 8))
            b = gl.convert_layout(gl.reshape(gl.permute(x, (1, 2, 0, 3, 4)), (32, 8)), B,
                                  assert_trivial=True)
            acc = mma_v2(a, b, acc)
        cv = gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        cc = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
        part = gl.sum(gl.where(cc[None, :] == ((cv // 16) % W)[:, None], acc, 0.0), axis=1)
        return gl.sum(gl.reshape(part, (MR, W, 16)), axis=1)  # a row's slices, across warps

    @gluon.jit
    def _block_rows(y, MR: gl.constexpr):
        """(block m [MR, 1], row r [1, 16]) index grids in ``y``'s layout ([MR, 16])."""
        ym = gl.arange(0, MR, layout=gl.SliceLayout(1, y.type.layout))
        yr = gl.arange(0, 16, layout=gl.SliceLayout(0, y.type.layout))
        return ym[:, None], yr[None, :]

    @gluon.jit
    def _down_mma(act_ptr, w_ptr, out_ptr, ids_ptr, wts_ptr, stride_a, stride_we, stride_wn,
                  stride_o, I: gl.constexpr, MR: gl.constexpr, EVICT: gl.constexpr,
                  PF: gl.constexpr, PDL: gl.constexpr):
        """Program (pair, block): the pair's outputs 16 MR block .. over the whole of I."""
        W: gl.constexpr = gl.num_warps()
        SL: gl.constexpr = I // W
        pdl_trigger(PDL)
        pair = gl.program_id(0).to(gl.int64)
        pdl_wait(PDL)
        expert = gl.load(ids_ptr + pair)
        rv = gl.arange(0, 16 * W * MR, layout=_rows_of(W, MR))
        row = gl.program_id(1) * 16 * MR + 16 * (rv // (16 * W)) + rv % 16
        y = _sliced_product(w_ptr + gl.maximum(expert, 0).to(gl.int64) * stride_we, row,
                            stride_wn, act_ptr + pair * stride_a, SL, MR, EVICT, PF)
        y = y * gl.load(wts_ptr + pair) * (expert >= 0).to(gl.float32)
        ym, yr = _block_rows(y, MR)
        gl.store(out_ptr + pair * stride_o + gl.program_id(1) * 16 * MR + 16 * ym + yr,
                 y.to(out_ptr.dtype.element_ty))

    @gluon.jit
    def _up_mma(x_ptr, w_ptr, act_ptr, ids_ptr, stride_x, stride_we, stride_wn, stride_a,
                H: gl.constexpr, I: gl.constexpr, TOP_K: gl.constexpr, MR: gl.constexpr,
                EVICT: gl.constexpr, PF: gl.constexpr, PDL: gl.constexpr):
        """Program (pair, block): the pair's activations at features 16 MR / 2 block .. (its
        blocks m < MR / 2 the gate rows of 16 features each, the others the same features'
        up rows, I rows on) over the whole of H."""
        W: gl.constexpr = gl.num_warps()
        SL: gl.constexpr = H // W
        HALF: gl.constexpr = MR // 2
        pdl_wait(PDL)
        pdl_trigger(PDL)  # (the down projection starts once the expert ids are final)
        pair = gl.program_id(0).to(gl.int64)
        expert = gl.load(ids_ptr + pair)
        f0 = gl.program_id(1) * 16 * HALF
        rv = gl.arange(0, 16 * W * MR, layout=_rows_of(W, MR))
        m = rv // (16 * W)
        row = (m // HALF) * I + f0 + 16 * (m % HALF) + rv % 16
        y = _sliced_product(w_ptr + gl.maximum(expert, 0).to(gl.int64) * stride_we, row,
                            stride_wn, x_ptr + (pair // TOP_K) * stride_x, SL, MR, EVICT, PF)
        dt: gl.constexpr = act_ptr.dtype.element_ty
        y = y.to(dt).to(gl.float32)  # (rounded as the stored gate/up row)
        gate, up = gl.split(gl.permute(gl.reshape(y, (2, HALF, 16)), (1, 2, 0)))
        act = (gate / (1.0 + gl.exp(-gate)) * up).to(dt)
        ym, yr = _block_rows(act, HALF)
        gl.store(act_ptr + pair * stride_a + f0 + 16 * ym + yr, act)


def down_mma(act: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor,
             out: torch.Tensor, mr: int = 1, warps: int = 4, prefetch: int = 1,
             evict: str = "") -> torch.Tensor:
    """``out[p] = wts[p] * w2[ids[p]] @ act[p]`` for the pairs' activations ``act`` [P, I]
    (16-bit), the experts' down weights ``w2`` [E, H, I] and their float32 weights ``wts``
    [P]: ``out`` [P, H] (``fits(H, I, mr, warps)`` must hold; ``prefetch``: the weights'
    later lines asked into L2 first; ``evict``: the weights' cache eviction policy)."""
    pairs, h, inter = ids.numel(), w2.shape[1], w2.shape[2]
    if not fits(h, inter, mr, warps) or w2.stride(2) != 1 or act.stride(1) != 1:
        raise ValueError(f"down_mma: {mr} x 16 rows a program, {warps} warps do not fit "
                         f"H={h}, I={inter}")
    _down_mma[(pairs, h // (16 * mr))](
        act, w2, out, ids, wts, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        I=inter, MR=mr, EVICT=evict, PF=bool(prefetch), num_warps=warps,
        **launch_options(out.device))
    return out


def up_mma(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor, act: torch.Tensor,
           top_k: int, mr: int = 2, warps: int = 8, prefetch: int = 1,
           evict: str = "") -> torch.Tensor:
    """``act[p] = silu(gate) * up`` of ``w13[ids[p]] @ x[p // top_k]`` (gate: the first I rows
    of ``w13`` [E, 2 I, H], up the rest): ``act`` [P, I] (``fits(2 I, H, mr, warps)`` must
    hold, ``mr`` even: half of a program's blocks gate rows; ``prefetch``, ``evict`` as in
    :func:`down_mma`)."""
    pairs, n13, h = ids.numel(), w13.shape[1], w13.shape[2]
    inter = n13 // 2
    if mr % 2 or not fits(n13, h, mr, warps) or w13.stride(2) != 1 or x.stride(1) != 1:
        raise ValueError(f"up_mma: {mr} x 16 rows a program, {warps} warps do not fit "
                         f"I={inter}, H={h}")
    _up_mma[(pairs, inter // (8 * mr))](
        x, w13, act, ids, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), H=h,
        I=inter, TOP_K=top_k, MR=mr, EVICT=evict, PF=bool(prefetch), num_warps=warps,
        **launch_options(x.device))
    return act


def moe_mma(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
            topk_weights: torch.Tensor, act: torch.Tensor, down: torch.Tensor, *,
            block_n: int = 2, block_k: int = 2048, warps: int = 4, l2_hints: int = 0,
            down_launch: tuple[int, ...] = (1, 4),
            up_launch: tuple[int, ...] | None = None) -> None:
    """One token (``x`` [1, H]) through its k experts: the activations into ``act`` [k, I]
    (``up_launch`` = (MR, warps[, prefetch]): by :func:`up_mma`; None: by the CUDA-core up
    projection's GLU form, ``block_n`` rows a program, half of them gate rows and half the
    same features' up rows), then :func:`down_mma` at ``down_launch`` = (MR, warps[,
    prefetch]) into ``down`` [k, H] (each pair's weighted row; ``kernels.combine_pairs`` sums
    them)."""
    k = topk_ids.numel()
    ids = topk_ids.reshape(-1)
    evict = "evict_first" if l2_hints else ""
    if up_launch is not None:
        up_mma(x, w13, ids, act, k, *up_launch, evict=evict)
    else:
        glu_up(x, w13, ids, act, k, block_n, block_k, warps, evict)
    down_mma(act, w2, ids, topk_weights.reshape(-1), down, *down_launch, evict=evict)
