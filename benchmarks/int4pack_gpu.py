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

    python3 benchmarks/int4pack_gpu.py [--rows 1,4,16,32] [--tiles 2,4,8]
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


def make(n: int, k: int, tiles: tuple[int, ...]) -> dict:
    """One layer: our packed codes, float32 scales/biases (symmetric: b = -8 s, as GPTQ), the
    dense bf16 weight they stand for, and PyTorch's packing at each ``inner_k_tiles``."""
    from engine.runtime import quant_triton as qt

    codes = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.int32)
    s = (torch.rand(k // GROUP, n, device="cuda") * 0.01).to(torch.bfloat16).float()
    b = -8 * s
    t = {"q": qt.pack_affine(codes, 4, 32), "s": s, "b": b}
    u8 = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8)
    for it in tiles:
        t[f"p{it}"] = torch._convert_weight_to_int4pack(u8, it)
    t["sz"] = torch.stack([s, b + 8 * s], dim=2).to(torch.bfloat16).contiguous()
    return t


def weight(t: dict, k: int) -> torch.Tensor:
    """The dense float32 weight [N, K] of ``t`` (from our packed form)."""
    from engine.runtime import quant_triton as qt

    return qt.dequant_affine(t["q"], t["s"], t["b"], 4, GROUP, 32, k, torch.float32)


def routes(tiles: tuple[int, ...], dense: dict) -> dict:
    from engine.runtime import gemv_triton as gt
    from engine.runtime import quant_triton as qt

    out = {"ours": lambda x, t: qt.affine_mm(x, t["q"], t["s"], t["b"], 4, GROUP, 32)}
    for it in tiles:
        out[f"torch k{it}"] = (lambda it_: lambda x, t: torch._weight_int4pack_mm(
            x, t[f"p{it_}"], GROUP, t["sz"]))(it)
    out["bf16"] = lambda x, t: (gt.gemv(x, dense[id(t)]) if x.shape[0] == 1
                                else torch.nn.functional.linear(x, dense[id(t)]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,4,16,32")
    ap.add_argument("--tiles", default="2,4,8")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    torch.manual_seed(0)
    tiles = tuple(int(t) for t in args.tiles.split(","))
    rows = [int(r) for r in args.rows.split(",")]
    names = None
    step: dict = {}
    for layer, (n, k) in SHAPES.items():
        count = max(2, -(-L2_BYTES // (n * k // 2)))  # each route's codes: more than the L2
        sets = [make(n, k, tiles) for _ in range(count)]
        dense = {id(t): weight(t, k).to(torch.bfloat16) for t in sets}
        rs = routes(tiles, dense)
        if names is None:
            names = list(rs)
            print("| layer | rows | " + " | ".join(f"{r} us" for r in names) + " | max rel err "
                  + " / ".join(names) + " |")
            print("|---|---|" + "---|" * (len(names) + 1))
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            want = x.float() @ weight(sets[0], k).t()
            errs, times = [], []
            for name, fn in rs.items():
                try:
                    got = fn(x, sets[0]).float()
                    errs.append(f"{((got - want).abs().max() / want.abs().max()).item():.1e}")
                    us = time_us(fn, sets, x, args.iters)
                except Exception as e:  # noqa: BLE001 (a route this torch lacks: say why)
                    errs.append(type(e).__name__)
                    us = float("nan")
                    print(f"  {name} at {layer}, {m} rows: {e}"[:300], flush=True)
                times.append(us)
                step[(name, m)] = step.get((name, m), 0.0) + us * LAYERS
            print(f"| {layer} | {m} | " + " | ".join(f"{t:.1f}" for t in times) + " | "
                  + " / ".join(errs) + " |", flush=True)
        del sets, dense
        torch.cuda.empty_cache()
    print("\n| rows | " + " | ".join(f"{r} ms (x bf16)" for r in names) + " |")
    print("|---|" + "---|" * len(names))
    for m in rows:
        base = step[("bf16", m)]
        print(f"| {m} | " + " | ".join(f"{step[(r, m)] / 1e3:.3f} ({step[(r, m)] / base:.2f})"
                                       for r in names) + " |")


if __name__ == "__main__":
    main()
