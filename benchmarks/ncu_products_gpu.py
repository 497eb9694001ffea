"""One-row products of Llama-3-8B's four linear layers through the routes a model takes (bf16
``gemv``, fp8 ``w8_mm`` with dynamic per-row activations, 4-bit ``affine_mm``), run eagerly a
few times each, for a kernel profiler to read (Nsight Compute's counters: time, DRAM
throughput, occupancy and its limits, warp stalls). Prints each launch's layer and format in
order, so the profiler's rows can be matched to them.

    ncu --clock-control none -k regex:'_gemv|_w8_swap|_affine' --section SpeedOfLight \\
        --section Occupancy --section LaunchStats --section WarpStateStats \\
        python3 benchmarks/ncu_products_gpu.py [--formats bf16,fp8,int4] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixed_cost_gpu import route  # noqa: E402
from gemv_gpu import SHAPES, make  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="bf16,fp8,int4")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    for fmt in args.formats.split(","):
        fn = route(fmt)
        for layer, (n, k) in SHAPES.items():
            t = make(fmt, n, k)
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            for r in range(args.repeat):
                fn(x, t)
                torch.cuda.synchronize()
                print(f"launch {fmt} {layer} {n}x{k} round {r}", flush=True)


if __name__ == "__main__":
    main()
