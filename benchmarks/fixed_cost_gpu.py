"""What one product costs besides its bytes: one-row products of growing width on a GPU, fitted
as ``time = fixed + bytes / rate``.

Each weight format's one-row product is timed as a decode step runs it (copies of the weight,
together more than the L2, one after the other in one replayed CUDA graph, PDL on where the
device has it) at K = 4096 and N from 1,024 to 28,672 outputs, through the routes the models
take: bf16 through :func:`engine.runtime.gemv_triton.gemv`, fp8 (per-row scales, activations
quantized per row) and int8 through :func:`engine.runtime.quant_triton.w8_mm`, 4-bit codes
(group 128) through :func:`engine.runtime.quant_triton.affine_mm`. A least-squares line
through (bytes, microseconds) gives each route's fixed cost per product (what the product
pays whatever its size: the wait for the previous kernel, the first loads, the tail) and its
streaming rate; the table prints each width's time and TB/s, then the fit against the 4.3 TB/s
copy rate.

    python benchmarks/fixed_cost_gpu.py [--formats bf16,fp8,int8,int4] [--widths 1024,4096]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_gpu import BANDWIDTH, make, nbytes, time_us  # noqa: E402
from swap_affine_gpu import copies  # noqa: E402

WIDTHS = (1024, 2048, 4096, 8192, 16384, 28672)
K = 4096


def route(fmt: str):
    """(x, weight dict) -> y through the route a model's one-row product takes."""
    from engine.runtime import gemv_triton as gt
    from engine.runtime import quant_triton as qt

    if fmt == "bf16":
        return lambda x, t: gt.gemv(x, t["w"])
    if fmt == "int4":
        return lambda x, t: qt.affine_mm(x, t["q"], t["s"], t["b"], 4, 128, 32)
    if fmt == "int4swap":  # the swapped-operand 4-bit kernel at its one-row launch
        from engine.runtime.swap_affine import affine_swap

        return lambda x, t: affine_swap(x, t["q"], t["s"], t["b"], 4, 128, 32)
    if fmt == "fp8_block":
        return lambda x, t: qt.w8_mm(x, t["w"], t["s"], act="group", block=(128, 128))
    return lambda x, t: qt.w8_mm(x, t["w"], t["s"], act="token")


def measure(fmt: str, n: int, iters: int) -> tuple[int, float]:
    """(bytes of one weight, us per product) of ``fmt`` at [n, K]."""
    sets = copies(lambda n_, k_: make(fmt, n_, k_), n, K)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    return nbytes(sets[0]), time_us(route(fmt), sets, x, iters)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed us, TB/s) of the least-squares line us = fixed + bytes / rate."""
    b = torch.tensor([p[0] for p in points], dtype=torch.float64)
    t = torch.tensor([p[1] for p in points], dtype=torch.float64)
    a = torch.stack([torch.ones_like(b), b], dim=1)
    fixed, slope = torch.linalg.lstsq(a, t[:, None]).solution[:, 0]
    return fixed.item(), 1e-6 / slope.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="bf16,fp8,int8,int4")
    ap.add_argument("--widths", default=",".join(str(w) for w in WIDTHS))
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    torch.manual_seed(0)
    widths = [int(w) for w in args.widths.split(",")]
    print("| format | N x K | MB | us | TB/s |\n|---|---|---|---|---|")
    fits = []
    for fmt in args.formats.split(","):
        points = []
        for n in widths:
            b, us = measure(fmt, n, args.iters)
            points.append((b, us))
            print(f"| {fmt} | {n}x{K} | {b / 1e6:.1f} | {us:.1f} | {b / us / 1e6:.2f} |",
                  flush=True)
            torch.cuda.empty_cache()
        fixed, rate = fit(points)
        fits.append((fmt, fixed, rate))
    print("\n| format | fixed us a product | streaming TB/s | of 4.3 TB/s |\n|---|---|---|---|")
    for fmt, fixed, rate in fits:
        print(f"| {fmt} | {fixed:.2f} | {rate:.2f} | {rate / (BANDWIDTH / 1e12) * 100:.0f} % |")


if __name__ == "__main__":
    main()
