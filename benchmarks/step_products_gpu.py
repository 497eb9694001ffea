"""The one-row products of a Llama-3-8B decode step as a chain, on a GPU: 32 layers of q/k/v,
o, gate/up and down with their own bf16 weights (13.96 GB), each product's input taken from the
previous product's output (as a step runs them, so every product waits for the one before),
captured in one CUDA graph and replayed. With ``--small`` the step's small kernels between
them too (residual add + RMSNorm before q/k/v and gate/up, SiLU-and-mul before down).

Variants (same weights, same process): ``cublas`` (torch's linear), ``default`` (the Triton
matrix-vector kernel that streams its weights after the wait, ``ENGINE_GEMV_EARLY=0``),
``early`` (as served: each program loads all of its weights into registers before its wait),
``early:BNxKCxWARPS`` (that launch for every layer, e.g. ``early:8x2048x4``),
``early:deep=2x16384x8+square=...`` (those launches for those shape classes), ``chain`` (the
chained layer, ``gemv_triton.gemv_chain``: the norms, residual adds and SiLU-and-mul inside the
products' prologues and epilogues, so the same work as ``--small`` with no kernel between them).

    python3 benchmarks/step_products_gpu.py [--variants cublas,default,early] [--small]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from engine.runtime import fused_triton
from engine.runtime import gemv_triton as gt

sys.path.insert(0, os.path.dirname(__file__))
from quant_gpu import replay_ms  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
LAYERS = 32
BW = 4.3e12
ENVS = ("ENGINE_GEMV_EARLY", "ENGINE_GEMV_EARLY_CONFIG")


def weights() -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    return [{name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
             for name, (n, k) in SHAPES.items()} for _ in range(LAYERS)]


def chain(layers: list[dict], x: torch.Tensor, linear, small: bool) -> torch.Tensor:
    norm_w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    h, res = x, x
    for w in layers:
        if small:
            h, res = fused_triton.add_rms_norm(h, res, norm_w, 1e-6)
        qkv = linear(h, w["qkv"])
        o = linear(qkv[:, :4096], w["o"])
        if small:
            o, res = fused_triton.add_rms_norm(o, res, norm_w, 1e-6)
        gu = linear(o, w["gate_up"])
        act = fused_triton.silu_and_mul(gu) if small else gu[:, :14336]
        h = linear(act, w["down"])
    return h


def chained(layers: list[dict], x: torch.Tensor) -> torch.Tensor:
    norm_w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    norm = dict(norm_w=norm_w, eps=1e-6)
    h, ss = x, torch.full((1024,), 4.0, device="cuda")  # (any sums: the first norm's)
    for w in layers:
        qkv = gt.gemv_chain(h, w["qkv"], sumsq=ss, **norm)[0]
        o, ss = gt.gemv_chain(qkv[:, :4096], w["o"], residual=h)
        act = gt.gemv_chain(o, w["gate_up"], sumsq=ss, glu=True, **norm)[0]
        h, ss = gt.gemv_chain(act, w["down"], residual=o)
    return h


def time_variant(layers: list[dict], variant: str, small: bool) -> float:
    for env in ENVS:
        os.environ.pop(env, None)
    name, _, cfg = variant.partition(":")
    saved = dict(gt.EARLY_CONFIGS)
    if name == "default":  # (the kernel before: no weights loaded before the wait)
        os.environ["ENGINE_GEMV_EARLY"] = "0"
    elif name == "early":
        for part in filter(None, cfg.split("+")):  # CLASS=BNxKCxWARPS: that class's launch
            cls, _, launch = part.rpartition("=")
            if cls:
                gt.EARLY_CONFIGS[cls] = tuple(int(v) for v in launch.split("x"))
            else:
                os.environ["ENGINE_GEMV_EARLY_CONFIG"] = launch.replace("x", ",")
    linear = (lambda a, w: F.linear(a, w)) if name == "cublas" else (lambda a, w: gt.gemv(a, w))
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    run = (lambda: chained(layers, x)) if name == "chain" else \
        (lambda: chain(layers, x, linear, small))
    try:  # (the launches read the switches when captured; the graphs keep them)
        return min(replay_ms(run, 5) for _ in range(3))
    finally:
        for env in ENVS:
            os.environ.pop(env, None)
        gt.EARLY_CONFIGS.update(saved)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="cublas,default,early,default,early")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    layers = weights()
    nbytes = sum(t.numel() * 2 for w in layers for t in w.values())
    rows = []
    for variant in args.variants.split(","):
        try:
            ms = time_variant(layers, variant, args.small)
        except Exception as exc:  # a launch the compiler rejects (registers, shared memory)
            print(f"{variant}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            continue
        rows.append([variant, round(ms, 3), round(nbytes / (ms * 1e-3) / 1e12, 2),
                     f"{nbytes / BW / (ms * 1e-3):.0%}"])
        print(rows[-1], flush=True)
    print(f"\none-row products of a Llama-3-8B step ({nbytes / 1e9:.2f} GB, chained"
          f"{', with the small kernels' if args.small else ''}; roofline at 4.3 TB/s "
          f"{nbytes / BW * 1e3:.3f} ms)\n| variant | ms | TB/s | of 4.3 TB/s |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


if __name__ == "__main__":
    main()
