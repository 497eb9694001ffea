"""One weight-only 4- or 8-bit layer on the CPU: the packed product (``fused_cpu.affine``:
codes, float32 scales and biases, an eighth or a quarter of the dense bytes) against the dense
float32 product
(``fused_cpu.gemv``) of the same weight, per layer shape and row count. Each shape is timed
over distinct copies of the weight, together more than the L3 cache, one after the other (as a
decode step reads its layers: every weight cold); the table prints the microseconds of each
and their ratio (best of three runs).

    python benchmarks/affine_cpu.py [--rows 1,4,8,12] [--bits 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.runtime import fused_cpu

#: (N, K, group): the default model's q/k/v, o, gate/up and down, and larger layers
SHAPES = ((960, 576, 64), (576, 576, 64), (3072, 576, 64), (576, 1536, 64), (2048, 2048, 128),
          (4096, 4096, 128), (4096, 14336, 128))
COPY_BYTES = 256 << 20  # dense copies of a shape together: several times the L3


def per_call_us(fn, sets: list, iters: int) -> float:
    for t in sets[:2]:
        fn(t)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            for t in sets:
                fn(t)
        best = min(best, (time.perf_counter() - t0) / iters / len(sets) * 1e6)
    return best


def make(n: int, k: int, group: int, bits: int) -> tuple:
    codes = torch.randint(0, 1 << bits, (n, k))
    packed = codes.to(torch.uint8)
    if bits == 4:
        c = packed.reshape(n, k // 32, 2, 16)
        packed = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(n, k // 2)
    scale, bias = torch.rand(n, k // group) * 0.01, torch.randn(n, k // group) * 0.01
    dense = codes.float() * scale.repeat_interleave(group, 1) + bias.repeat_interleave(group, 1)
    return packed.contiguous(), scale, bias, dense.contiguous()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,4,8,12")
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not fused_cpu.available():
        print("skipped: the CPU kernels are not available here")
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{args.bits}-bit codes, {args.threads} threads; us per product (packed / dense "
          "float32, ratio)\n")
    print("| N x K (group) | copies | " + " | ".join(f"{m} rows" for m in rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    for n, k, group in SHAPES:
        count = max(2, COPY_BYTES // (n * k * 4))
        sets = [make(n, k, group, args.bits) for _ in range(count)]
        iters = max(1, 2_000_000_000 // (count * n * k * 8))
        cells = []
        for m in rows:
            x = torch.randn(m, k)
            packed = per_call_us(lambda t: fused_cpu.affine(x, t[0], args.bits, t[1], t[2],
                                                            group, None), sets, iters)
            dense = per_call_us(lambda t: fused_cpu.gemv(x, t[3], None), sets, iters)
            cells.append(f"{packed:.0f} / {dense:.0f} ({packed / dense:.2f})")
        print(f"| {n} x {k} ({group}) | {count} | " + " | ".join(cells) + " |", flush=True)
        del sets


if __name__ == "__main__":
    main()
