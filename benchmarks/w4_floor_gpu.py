"""What the one-row 4-bit products cost when their packed words need not come from memory: the
kernels' own floor (instructions, latency, launch), per layer, on a GPU.

Each of Llama-3-8B's four linear layers (int4 codes in groups of 128, the compact 16-bit
constants the loader keeps) at one row, through the route a decode step takes
(:func:`engine.runtime.quant_triton.affine_mm`) and through the swapped kernel at its default
launch (:func:`engine.runtime.swap_affine.affine_swap`), three ways, each a CUDA graph of
products replayed (as the step runs them, PDL on where the GPU has it):

- ``cold``: distinct copies of the layer, together more than the L2 (the step's case);
- ``hot``: the same weight again and again (served from the L2 where it fits: q/k/v, o and down
  on a 50 MB L2; gate/up does not fit);
- ``alias``: every output row reads the same packed row (the words stride 0 between rows), so
  the words come from the L2 for every layer, at the launch and program count the layer has;
  the scales and offsets stay the layer's own. Results are not checked (they are not the
  layer's).

The gap between ``cold`` and ``alias`` is what the memory costs beyond the kernel's own work;
``alias`` alone is a floor no memory system lifts (the H100 and the H200 share the SMs and
clocks, so it carries from one to the other).

    python3 benchmarks/w4_floor_gpu.py [--layers qkv,o,gate_up,down] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from engine.runtime import quant_triton as qt
from engine.runtime import swap_affine as sa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_gpu import SHAPES, nbytes  # noqa: E402
from swap_affine_gpu import copies, weights  # noqa: E402
from swap_gpu import table, timed  # noqa: E402

BITS, SUB, GROUP = 4, 32, 128


def routes():
    return {"step route": lambda x, t: qt.affine_mm(x, t["q"], t["s"], t["b"], BITS, GROUP, SUB),
            "swapped": lambda x, t: sa.affine_swap(x, t["q"], t["s"], t["b"], BITS, GROUP,
                                                   SUB)}


def layer_rows(name: str, iters: int) -> list[list]:
    """The table's rows of one layer: each route cold, hot and aliased."""
    n, k = SHAPES[name]
    cold = copies(lambda n_, k_: weights(n_, k_, GROUP, "cuda", compact=True), n, k)
    first = cold[0]
    hot = [first] * len(cold)
    alias = [dict(first, q=first["q"][:1].expand(n, -1))] * len(cold)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    mb = nbytes(first) / 1e6
    rows = []
    for route, fn in routes().items():
        us = [timed(fn, s, x, iters) for s in (cold, hot, alias)]
        rows.append([name, f"{n} x {k}", f"{mb:.1f}", route, sa.default_config(n, k, 1),
                     *(f"{u:.1f}" for u in us), f"{mb / us[0]:.2f}", f"{us[2] / us[0]:.2f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="qkv,o,gate_up,down")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    torch.manual_seed(0)
    rows = []
    for name in args.layers.split(","):
        rows += layer_rows(name, args.iters)
        torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name()}: one row, us a product")
    table(["layer", "N x K", "MB", "route", "swapped launch", "cold us", "hot us", "alias us",
           "cold TB/s", "alias / cold"], rows)


if __name__ == "__main__":
    main()
