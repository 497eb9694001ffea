"""One row of 4-bit codes on the matrix unit from registers (:func:`engine.runtime.affine_mma`,
Gluon) against the one-row route :func:`affine_mm` ships and against bf16 (our ``gemv``), on
the linear layers of a Llama-3-8B decode step: first checks against the float32 product of
the dequantized weight (every layer, groups 32-256, bfloat16 and float16, a bias, odd N and
every split), then the us of each route per layer (distinct copies of the layer, together more
than the L2, in one replayed CUDA graph, as the other GPU benchmarks time them) and the step's
products (x 32 layers).

    python3 benchmarks/affine_mma_gpu.py [--configs MR,W,CT,SPLIT,D[,XA,CG,S];...]
        [--iters 20] [--skip-checks | --light-checks]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_gpu import L2_BYTES, LAYERS, SHAPES, time_us  # noqa: E402

#: layers of the checks beside the step's: odd output counts, a K of one tile, a split tail
CHECK_SHAPES = {"odd": (1000, 1280), "tiny": (24, 256), "tail": (4100, 2816)}


def make(n: int, k: int, group: int, device: str = "cuda") -> dict:
    from engine.runtime import quant_triton as qt

    codes = torch.randint(0, 16, (n, k), device=device, dtype=torch.int32)
    s = torch.rand(k // group, n, device=device) * 0.01
    b = (torch.rand(k // group, n, device=device) - 0.5) * 0.1
    return {"q": qt.pack_affine(codes, 4, 32), "s": s, "b": b, "codes": codes, "group": group}


def dense(t: dict) -> torch.Tensor:
    g = t["group"]
    s = t["s"].t().repeat_interleave(g, 1)
    b = t["b"].t().repeat_interleave(g, 1)
    return t["codes"].float() * s + b


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-9)).item()


def checks(configs: list, light: bool = False) -> int:
    """Failures of the kernel against the float32 product: the default launch and
    ``configs`` on every layer, group, dtype and bias, and every split and depth on the small
    shapes (``light``: only ``configs``, groups of 128, with a bias)."""
    from engine.runtime.affine_mma import affine_mma

    bad = 0
    shapes = {**CHECK_SHAPES, **SHAPES}
    print("| layer | group | dtype | bias | config | max rel err |")
    print("|---|---|---|---|---|---|")
    for layer, (n, k) in shapes.items():
        for group in (128,) if light else (128, 64, 32, 256):
            if k % group:
                continue
            t = make(n, k, group)
            w = dense(t)
            bad_before = bad
            for dtype in (torch.bfloat16, torch.float16):
                x = torch.randn(1, k, device="cuda").to(dtype)
                bias = torch.randn(n, device="cuda").to(dtype)
                for with_bias in (True,) if light else (False, True):
                    want = x.float() @ w.t() + (bias.float() if with_bias else 0)
                    ct_max = 8 * group // 256
                    cfgs = [None] * (not light) + [c for c in configs if c[2] <= ct_max
                                                   and (c[2] * 256) % group == 0]
                    if layer in CHECK_SHAPES and not light:  # every split of the small ones
                        cfgs += [(1, 4, 1, s, d) for s in (1, 2, 3, 5, k // 256 + 2)
                                 for d in (1, 2, 3, 4)]
                    for cfg in cfgs:
                        got = affine_mma(x, t["q"], t["s"], t["b"], group,
                                         bias=bias if with_bias else None, config=cfg)
                        err = rel(got, want)
                        if err > 1e-2 or not torch.isfinite(got).all():
                            bad += 1
                            print(f"| {layer} | {group} | {dtype} | {with_bias} | {cfg} | "
                                  f"{err:.2e} FAIL |", flush=True)
            if bad == bad_before:
                print(f"| {layer} | {group} | bf16, fp16 | both | {len(cfgs)} launches | ok |",
                      flush=True)
            del t, w
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="",
                    help="extra launches MR,W,CT,SPLIT,D[,XA,CG,S] separated by ';' (timed and "
                         "checked)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--light-checks", action="store_true",
                    help="check only --configs (groups of 128, with a bias) before timing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    from engine.runtime import gemv_triton as gt
    from engine.runtime import quant_triton as qt
    from engine.runtime.affine_mma import affine_mma, default_config

    torch.manual_seed(0)
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";") if c]
    print(f"device: {torch.cuda.get_device_name()}")
    if not args.skip_checks and checks(configs, args.light_checks):
        print("checks FAILED")
        sys.exit(1)
    routes = {"bf16 gemv": lambda x, t: gt.gemv(x, t["w"]),
              "affine_mm (shipped)": lambda x, t: qt.affine_mm(x, t["q"], t["s"], t["b"], 4,
                                                              128, 32),
              "mma (default)": lambda x, t: affine_mma(x, t["q"], t["s"], t["b"], 128)}
    for c in configs:
        routes[f"mma {c}"] = (lambda c_: lambda x, t: affine_mma(x, t["q"], t["s"], t["b"], 128,
                                                                config=c_))(c)
    names = list(routes)
    print("\n| layer | " + " | ".join(f"{r} us" for r in names) + " | mma default |")
    print("|---|" + "---|" * (len(names) + 1))
    step = dict.fromkeys(names, 0.0)
    for layer, (n, k) in SHAPES.items():
        count = max(2, -(-L2_BYTES // (n * k // 2)))
        sets = []
        for _ in range(count):
            t = make(n, k, 128)
            del t["codes"]
            sets.append(t)
        dsets = [{"w": torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02}
                 for _ in range(max(2, -(-L2_BYTES // (n * k * 2))))]
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        times = []
        for name in names:
            us = time_us(routes[name], dsets if name == "bf16 gemv" else sets, x, args.iters)
            times.append(us)
            step[name] += us * LAYERS
        print(f"| {layer} | " + " | ".join(f"{t:.1f}" for t in times)
              + f" | {default_config(n, k, 128)} |", flush=True)
        del sets, dsets
        torch.cuda.empty_cache()
    base = step["bf16 gemv"]
    print("\n| the step's products (x 32 layers) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    print("| ms (x bf16) | " + " | ".join(f"{step[r] / 1e3:.3f} ({step[r] / base:.2f})"
                                         for r in names) + " |")


if __name__ == "__main__":
    main()
