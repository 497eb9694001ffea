"""Whether ``torch._scaled_mm`` takes DeepSeek-style block fp8 here (activations in 1 x 128
groups, weights in 128 x 128 blocks) and how fast, against bf16 cuBLAS and our ``w8_mm``, on the
shapes of a Llama-3-8B decode step's linear layers. Prints one table; each variant that raises
prints its error instead (the scale layouts differ between torch versions).

    python3 benchmarks/scaled_mm_block_gpu.py [--rows 1,16,32,128,2048]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_gpu import time_fn  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336), "o": (4096, 4096)}
FP8 = torch.float8_e4m3fn


def timed(fn) -> float:
    """µs per call, eagerly (one product at a time, launch overhead included)."""
    return time_fn(fn, iters=20, graph=False) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,32,128,2048")
    args = ap.parse_args()
    from engine.runtime import quant_triton as qt

    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"torch {torch.__version__}; us per product; err: max |y - ref| / max |ref|")
    print("| shape | rows | bf16 | w8_mm block | _scaled_mm block (err) |")
    print("|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) / 64
        wb = w.float().reshape(n // 128, 128, k // 128, 128)
        ws = wb.abs().amax((1, 3)) / 448  # [N/128, K/128]
        wq = (wb / ws[:, None, :, None]).reshape(n, k).to(FP8)
        wref = (wq.float().reshape(n // 128, 128, k // 128, 128) * ws[:, None, :, None])
        wref = wref.reshape(n, k).to(torch.bfloat16)
        for m in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            ref = (x.float() @ wref.float().t())
            dense = timed(lambda: x @ wref.t())
            ours = timed(lambda: qt.w8_mm(x, wq, ws, act="group", block=(128, 128)))
            xg = x.float().reshape(m, k // 128, 128)
            xs = xg.abs().amax(-1).clamp(min=1e-12) / 448  # [M, K/128]
            xq = (xg / xs[..., None]).reshape(m, k).to(FP8)
            cell = ""
            for label, sa, sb in (("a", xs, ws), ("b", xs.t().contiguous().t(), ws.t()),
                                  ("c", xs.t().contiguous().t(), ws)):
                try:
                    y = torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sb,
                                         out_dtype=torch.bfloat16)
                    err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                    t = timed(lambda: torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sb,
                                                       out_dtype=torch.bfloat16))
                    cell = f"{label}: {t:.1f} ({err:.1e})"
                    break
                except Exception as exc:  # each layout the torch build refuses
                    cell += f"{label}: {type(exc).__name__}: {str(exc)[:90]}; "
            print(f"| {name} {n}x{k} | {m} | {dense:.1f} | {ours:.1f} | {cell} |", flush=True)


if __name__ == "__main__":
    main()
