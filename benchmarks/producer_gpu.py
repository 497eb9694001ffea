"""What writing a block fp8 layer's input as group codes costs the kernel that writes it, on a
GPU: Llama-3-8B's one-row residual add + RMSNorm (4096 columns) and SiLU-and-mul (14336), each
as the plain kernel, the plain kernel followed by ``quant_triton.quant_groups`` (the codes made
by a launch of their own), and the kernel writing the codes itself (``fused_triton.
add_rms_norm_groups`` / ``silu_and_mul_groups``); with the codes rounded to the fp8 grid by the
conversion instruction (the default on an NVIDIA GPU) and in software
(``quant_triton.SOFTWARE_GRID``). Each case is ``--reps`` launches (or pairs) in one CUDA graph,
replayed: us a repetition, kernels chained by programmatic dependent launch as in a decode step.

    python benchmarks/producer_gpu.py [--reps 64] [--rounds 3]
"""

from __future__ import annotations

import argparse

import torch

from engine.runtime import fused_triton as ft
from engine.runtime import quant_triton as qt

FP8 = torch.float8_e4m3fn


def replay_us(run, reps: int) -> float:
    """``run`` captured ``reps`` times in one CUDA graph (``quant_gpu.replay_ms``): us a
    repetition of the replay."""
    from quant_gpu import replay_ms

    return replay_ms(lambda: [run() for _ in range(reps)], iters=50) * 1e3 / reps


def cases() -> dict:
    bf = dict(dtype=torch.bfloat16, device="cuda")
    x, res, w = torch.randn(1, 4096, **bf), torch.randn(1, 4096, **bf), torch.ones(4096, **bf)
    gate_up = torch.randn(1, 2 * 14336, **bf)
    return {
        "norm, bf16 row": lambda: ft.add_rms_norm(x, res, w, 1e-5),
        "norm + quant_groups": lambda: qt.quant_groups(ft.add_rms_norm(x, res, w, 1e-5)[0],
                                                       FP8, 128),
        "norm writing codes": lambda: ft.add_rms_norm_groups(x, res, w, 1e-5, FP8, 128),
        "SiLU-and-mul, bf16 row": lambda: ft.silu_and_mul(gate_up),
        "SiLU-and-mul + quant_groups": lambda: qt.quant_groups(ft.silu_and_mul(gate_up), FP8,
                                                               128),
        "SiLU-and-mul writing codes": lambda: ft.silu_and_mul_groups(gate_up, FP8, 128),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    runs = cases()
    times: dict = {}
    for r in range(args.rounds):
        for software in (False, True):
            qt.SOFTWARE_GRID = software
            for name, run in runs.items():
                times.setdefault((name, software), []).append(replay_us(run, args.reps))
    qt.SOFTWARE_GRID = False
    print(f"{torch.cuda.get_device_name()}: us a repetition ({args.reps} in a graph), "
          f"rounds {args.rounds}")
    print("| kernel(s) | grid by the conversion (default) | grid in software |")
    print("|---|---|---|")
    for name in runs:
        cols = [" / ".join(f"{t:.2f}" for t in times[(name, sw)]) for sw in (False, True)]
        print(f"| {name} | {cols[0]} | {cols[1]} |")


if __name__ == "__main__":
    main()
