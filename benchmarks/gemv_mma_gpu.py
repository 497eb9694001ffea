"""One row of bfloat16 weights on the matrix unit from registers (a probe, in Gluon): does a
16-bit weight's one-row product go faster through ``mma.sync`` than through the CUDA cores?

The down projection of one token's experts (Qwen3-30B-A3B: 2048 x 768 a pair) is bound by its
instructions as much as by its bytes on the H200 (docs/benchmarks/moe.md); on the CUDA cores a
16-bit weight costs a widening and an FMA at least. Here a thread loads 16 bytes of each of
two rows (g and g + 8 of a 16-row block, columns 8t .. 8t + 7 of a 32-column chunk, for the
lane's quad index t and group g) and hands them as loaded to two m16n8k16 instructions, the
chunk's K taken in the order that makes them the weight operand (logical column 16 s + 8 h +
2 t + e is column 8 t + 4 s + 2 h + e); the same order makes the thread's one 16-byte load of
x (columns 8t .. 8t + 7) its activation operand, x in the operand's first column and zeros in
the others. Each change of layout is proven free when the kernel builds
(``convert_layout(..., assert_trivial=True)``; tests/runtime/test_sm90_compile.py builds it for
sm_90). About one instruction a weight in that build against several on the CUDA cores.

On a GPU: each shape's product against float32 (max |difference| over max |y|), then us a
product cold (distinct copies, more than the L2) for this kernel, the bf16 gemv the decoder
uses (``gemv_triton.gemv``) and cuBLAS (``F.linear``), in replayed CUDA graphs::

    python3 benchmarks/gemv_mma_gpu.py [--shapes 2048x768,4096x4096,...] [--rows-a-warp 1,2]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
except ImportError:  # a Triton without Gluon
    gluon = gl = mma_v2 = None

if gluon is not None:
    # [16 warps mr rows, 4 (t), 8 (8 neighbouring columns)]: rows g and g + 8 of a warp's
    # 16-row block a lane, the 8 columns of its quad index t a 16-byte load (the layout of the
    # 4-bit kernel's words, there 8 words of a row); x's: [4 (t), 8 (8 neighbouring columns),
    # 8 (the operand's column, the lane's group)], as the MoE down projection's activations
    from engine.runtime.affine_mma import mma_layout
    from engine.runtime.affine_mma import words_layout as _w_layout
    from engine.runtime.triton_pdl import prefetch_l2
    from engine_moe_triton.token_mma import _act_layout as _x_layout

    @gluon.jit
    def _gemv_mma(w_ptr, x_ptr, y_ptr, K, stride_w, MR: gl.constexpr, AHEAD: gl.constexpr):
        """y[16 warps MR rows of this program] = W x over whole 32-column chunks. AHEAD > 0:
        each chunk asks the line AHEAD chunks on into L2 (a warp's loads otherwise wait for
        their chunks one after another: ptxas puts a chunk's loads next to its products)."""
        W: gl.constexpr = gl.num_warps()
        BN: gl.constexpr = 16 * W * MR
        MMA: gl.constexpr = mma_layout(W)
        A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
        WL: gl.constexpr = _w_layout(W, MR)
        XL: gl.constexpr = _x_layout(W)
        pid = gl.program_id(0)
        rn = gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, WL)))
        rt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL)))
        re = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL)))
        rows = (pid * BN + rn).to(gl.int64) * stride_w
        w_p = w_ptr + rows[:, None, None] + (rt * 8)[None, :, None] + re[None, None, :]
        xt = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, XL)))
        xe = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, XL)))
        xn = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, XL)))
        x_p = x_ptr + (xt * 8)[:, None, None] + xe[None, :, None] + 0 * xn[None, None, :]
        first = (xn == 0)[None, None, :]
        acc = gl.zeros((BN, 8), gl.float32, MMA)
        line = w_ptr + rows
        for c in range(0, K // 32):
            if AHEAD > 0:
                prefetch_l2(line + gl.minimum(32 * (c + AHEAD), K - 1), True)
            w = gl.reshape(gl.load(w_p), (BN, 4, 2, 2, 2))  # row, t, s, h, e
            a = gl.convert_layout(gl.reshape(gl.permute(w, (0, 2, 3, 1, 4)), (BN, 32)), A,
                                  assert_trivial=True)
            x = gl.reshape(gl.load(x_p, mask=first, other=0.0), (4, 2, 2, 2, 8))
            b = gl.convert_layout(gl.reshape(gl.permute(x, (1, 2, 0, 3, 4)), (32, 8)), B,
                                  assert_trivial=True)
            acc = mma_v2(a, b, acc)
            w_p += 32
            x_p += 32
        ry = gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        gl.store(y_ptr + pid * BN + ry, gl.sum(acc, axis=1).to(y_ptr.dtype.element_ty))


def gemv_mma(x: torch.Tensor, w: torch.Tensor, mr: int = 1, warps: int = 4,
             ahead: int = 0) -> torch.Tensor:
    """x [1, K] @ w[N, K]^T for bfloat16 x and w, K a multiple of 32 and N of 16 warps mr
    (``ahead``: each chunk asks for the line that many chunks on into L2)."""
    n, k = w.shape
    bn = 16 * warps * mr
    if n % bn or k % 32 or w.stride(1) != 1 or x.shape[0] != 1:
        raise ValueError(f"gemv_mma takes N a multiple of {bn} and K of 32, got {n} x {k}")
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_mma[(n // bn,)](w, x.contiguous(), y, k, w.stride(0), MR=mr, AHEAD=ahead,
                          num_warps=warps)
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="2048x768,4096x4096,6144x4096,4096x14336")
    ap.add_argument("--rows-a-warp", default="1,2,4")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if gluon is None or not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU and a Triton with Gluon")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gemv_gpu import time_us  # noqa: E402
    from swap_affine_gpu import copies  # noqa: E402
    from swap_gpu import table  # noqa: E402

    from engine.runtime import gemv_triton as gt

    torch.manual_seed(0)
    checks, rows = [], []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        sets = copies(lambda n_, k_: {"w": torch.randn(n_, k_, device="cuda",
                                                        dtype=torch.bfloat16) * 0.02}, n, k)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        want = (x.float() @ sets[0]["w"].float().t())
        fns = [("cuBLAS", lambda x, t: torch.nn.functional.linear(x, t["w"])),
               ("bf16 gemv", lambda x, t: gt.gemv(x, t["w"]))]
        fns += [(f"mma, {mr} rows a warp" + (f", L2 {ahead} chunks ahead" if ahead else ""),
                 lambda x, t, mr=mr, ahead=ahead: gemv_mma(x, t["w"], mr, ahead=ahead))
                for mr in (int(v) for v in args.rows_a_warp.split(",")) for ahead in (0, 8)]
        mb = n * k * 2 / 1e6
        for name, fn in fns:
            got = fn(x, sets[0]).float()
            checks.append([shape, name, f"{((got - want).abs().max() / want.abs().max()):.2e}"])
            us = time_us(fn, sets, x, args.iters)
            rows.append([shape, name, f"{us:.1f}", f"{mb / us:.2f}"])
    table(["N x K", "product", "max diff / max |y| vs float32"], checks)
    table(["N x K", "product", "cold us", "TB/s"], rows)


if __name__ == "__main__":
    main()
