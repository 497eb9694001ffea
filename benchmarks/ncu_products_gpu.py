"""One-row products of Llama-3-8B's four linear layers through the routes a model takes (bf16
``gemv``, fp8 ``w8_mm`` with dynamic per-row activations, 4-bit ``affine_mm``), and ``moe``:
one token through Qwen3-30B-A3B's routed experts (128 x 768 x 2048, top 8) with the triton
runner's one-token launch (``_pair_gemv_up``, ``_pair_gemv_down``, the combine), run eagerly a
few times each (``int4swap``: 4-bit codes through the swapped-operand kernel at its one-row
launch; ``fp8_block``: fp8 in 128 x 128 blocks), for a kernel profiler to read (Nsight
Compute's counters: time, DRAM throughput, occupancy and its limits, warp stalls). Prints each
launch's layer and format in order, so the profiler's rows can be matched to them.

    ncu --clock-control none -k regex:'_gemv|_w8_swap|_affine|_pair|_combine' \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats \\
        python3 benchmarks/ncu_products_gpu.py [--formats bf16,fp8,int4,moe,int4swap,fp8_block]
        [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixed_cost_gpu import route  # noqa: E402
from gemv_gpu import SHAPES, make  # noqa: E402


def moe_layer():
    """(run, description): one token through a Qwen3-30B-A3B layer's routed experts."""
    from engine_moe_triton.impl import GEMV_ONE_TOKEN, pair_launch
    from engine_moe_triton.kernels import combine_pairs, pair_moe

    e, h, inter, k = 128, 2048, 768, 8
    w13 = torch.randn(e, 2 * inter, h, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(e, h, inter, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    ids = torch.randperm(e, device="cuda")[:k].reshape(1, k).to(torch.int32)
    weights = torch.rand(1, k, device="cuda")
    gate_up = torch.empty(k, 2 * inter, device="cuda", dtype=torch.bfloat16)
    down = torch.empty(k, h, device="cuda", dtype=torch.bfloat16)
    launch = pair_launch(GEMV_ONE_TOKEN)

    def run():
        pair_moe(x, w13, w2, ids, weights, gate_up, down, **launch)
        combine_pairs(down, k, x.dtype)
    return run, f"moe experts {e}x{2 * inter}x{h} top {k}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="bf16,fp8,int4")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    for fmt in args.formats.split(","):
        if fmt == "moe":
            run, what = moe_layer()
            for r in range(args.repeat):
                run()
                torch.cuda.synchronize()
                print(f"launch {what} round {r}", flush=True)
            continue
        fn = route(fmt)
        for layer, (n, k) in SHAPES.items():
            t = make("int4" if fmt == "int4swap" else fmt, n, k)
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            for r in range(args.repeat):
                fn(x, t)
                torch.cuda.synchronize()
                print(f"launch {fmt} {layer} {n}x{k} round {r}", flush=True)


if __name__ == "__main__":
    main()
