"""4-bit weight-only products through PyTorch's own CUDA kernel (``torch._weight_int4pack_mm``,
the tiled int4 GEMM of torchao's int4 weight-only path) against ours (:func:`affine_mm`) and
bf16 (our ``gemv`` at one row, cuBLAS above), on the linear layers of a Llama-3-8B decode step.

PyTorch's kernel takes bfloat16 activations, codes packed by ``torch._convert_weight_to_int4pack``
(``inner_k_tiles`` 2, 4 or 8) and per-group bfloat16 (scale, zero) pairs with
``W = (q - 8) * scale + zero``; our canonical affine form ``W = q * s + b`` maps onto it as
``zero = b + 8 s`` (exact for symmetric GPTQ, where ``b = -8 s``). Each product is timed as the
other GPU benchmarks time them (distinct copies of the layer, together more than the L2, in one
replayed CUDA graph); each route is checked against the float32 product of the dequantized
weight first. Prints per (layer, rows) the us of each route, and the step (x 32 layers).

    python3 benchmarks/int4pack_gpu.py [--rows 1,4,16,32,128,2048] [--tiles 2,4,8]
    TRITON_INTERPRET=1 python3 benchmarks/int4pack_gpu.py --dry   (CPU: the checks alone)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_gpu import LAYERS, SHAPES, time_us  # noqa: E402
from gemv_gpu import L2_BYTES  # noqa: E402

GROUP = 128
#: ``--dry``: one small layer on the CPU (the Triton interpreter, PyTorch's CPU twin), checks only
DRY_SHAPES = {"dry": (256, 512)}


def make(n: int, k: int, tiles: tuple[int, ...], device: str) -> dict:
    """One layer: the canonical affine weight (symmetric codes, b = -8 s as GPTQ's, scales
    that bfloat16 holds exactly) and its :class:`Int4PackWeight` at each ``inner_k_tiles``."""
    from engine.runtime.quant_methods import AffineWeight, Int4PackWeight

    codes = torch.randint(0, 16, (n, k), device=device, dtype=torch.int32)
    s = (torch.rand(n, k // GROUP, device=device) * 0.01).to(torch.bfloat16).float()
    aw = AffineWeight(codes, s, -8 * s, 4, GROUP)
    forms = {f"torch k{it}": Int4PackWeight(aw, it) for it in tiles}
    return {"ours": aw.pack(), **forms}


def weight(t: dict) -> torch.Tensor:
    """The dense float32 weight [N, K] of ``t`` (from our packed form)."""
    from engine.runtime import quant_triton as qt

    aw = t["ours"]
    return qt.dequant_affine(aw.q, aw.scale, aw.bias, 4, GROUP, aw.sub, aw.k, torch.float32)


def routes(tiles: tuple[int, ...], dense: dict) -> dict:
    from engine.runtime import gemv_triton as gt

    out = {name: (lambda name_: lambda x, t: t[name_].matmul(x, None))(name)
           for name in ["ours"] + [f"torch k{it}" for it in tiles]}
    out["bf16"] = lambda x, t: (gt.gemv(x, dense[id(t)]) if x.shape[0] == 1 and x.is_cuda
                                else torch.nn.functional.linear(x, dense[id(t)]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,4,16,32,128,2048")
    ap.add_argument("--tiles", default="2,4,8")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dry", action="store_true",
                    help="one small layer on the CPU under TRITON_INTERPRET=1: checks, no timing")
    args = ap.parse_args()
    if not args.dry and not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    torch.manual_seed(0)
    device = "cpu" if args.dry else "cuda"
    tiles = tuple(int(t) for t in args.tiles.split(","))
    rows = [int(r) for r in args.rows.split(",")]
    names = None
    step: dict = {}
    for layer, (n, k) in (DRY_SHAPES if args.dry else SHAPES).items():
        # each route's codes together more than the L2 (one set for a dry run)
        count = 1 if args.dry else max(2, -(-L2_BYTES // (n * k // 2)))
        sets = [make(n, k, tiles, device) for _ in range(count)]
        dense = {id(t): weight(t).to(torch.bfloat16) for t in sets}
        rs = routes(tiles, dense)
        if names is None:
            names = list(rs)
            print("| layer | rows | " + " | ".join(f"{r} us" for r in names) + " | max rel err "
                  + " / ".join(names) + " |")
            print("|---|---|" + "---|" * (len(names) + 1))
        for m in rows:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            want = x.float() @ weight(sets[0]).t()
            errs, times = [], []
            for name, fn in rs.items():
                try:
                    got = fn(x, sets[0]).float()
                    errs.append(f"{((got - want).abs().max() / want.abs().max()).item():.1e}")
                    us = float("nan") if args.dry else time_us(fn, sets, x, args.iters)
                except Exception as e:  # noqa: BLE001 (a route this torch lacks: say why)
                    errs.append(type(e).__name__)
                    us = float("nan")
                    print(f"  {name} at {layer}, {m} rows: {e}"[:300], flush=True)
                times.append(us)
                step[(name, m)] = step.get((name, m), 0.0) + us * LAYERS
            print(f"| {layer} | {m} | " + " | ".join(f"{t:.1f}" for t in times) + " | "
                  + " / ".join(errs) + " |", flush=True)
        del sets, dense
        if not args.dry:
            torch.cuda.empty_cache()
    print("\n| rows | " + " | ".join(f"{r} ms (x bf16)" for r in names) + " |")
    print("|---|" + "---|" * len(names))
    for m in rows:
        base = step[("bf16", m)]
        print(f"| {m} | " + " | ".join(f"{step[(r, m)] / 1e3:.3f} ({step[(r, m)] / base:.2f})"
                                       for r in names) + " |")


if __name__ == "__main__":
    main()
