"""One row of 4-bit codes per layer through :func:`engine.runtime.nibbles_triton.gemv_nibbles`
(the CUDA cores, the words of several rows a thread) at several launches, against the route a
decode step takes without it (:func:`engine.runtime.quant_triton.affine_mm` with
``ENGINE_W4_NIBBLES=0``: the "step route" below), on a GPU.

Llama-3-8B's four linear layers (int4 codes in groups of 128, the compact 16-bit constants the
loader keeps). First each launch's products against the step route's on the same inputs
(max |difference| over the largest output), then us a product in a replayed CUDA graph (PDL on
where the GPU has it): ``cold`` over distinct copies of the layer (more than the L2: the step's
case), ``hot`` the same weight again (from the L2 where it fits).

    python3 benchmarks/nibbles_gpu.py [--layers qkv,o,gate_up,down] [--launches L;L;...]
        [--iters 20]      (L: BLOCK_N,TILES,split,warps,VEC[,PRE_CONST]; split 0: one
                           iteration a program)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from engine.runtime import nibbles_triton as nt
from engine.runtime import quant_triton as qt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_gpu import SHAPES, nbytes  # noqa: E402
from swap_affine_gpu import copies, weights  # noqa: E402
from swap_gpu import table, timed  # noqa: E402

BITS, SUB, GROUP = 4, 32, 128
LAUNCHES = ("64,2,0,4,4,0;64,2,0,4,4,1;64,1,0,4,4,0;64,1,0,4,4,1;32,2,0,2,4,1;128,2,0,8,4,0;"
            "128,2,0,8,4,1;128,2,0,4,4,1;64,2,4,4,4;64,1,4,4,4")


def step_route(x, t):
    return qt.affine_mm(x, t["q"], t["s"], t["b"], BITS, GROUP, SUB)


# the step route without gemv_nibbles (the baseline every launch here is set against)
qt.W4_NIBBLES_CLASSES, qt.W4_NIBBLES_ROUTE = frozenset(), {}


def nibbles(config: tuple):
    return lambda x, t: nt.gemv_nibbles(x, t["q"], t["s"], t["b"], GROUP, SUB, config=config)


def layer_rows(name: str, launches: list[tuple], iters: int) -> tuple[list, list]:
    """(correctness rows, timing rows) of one layer."""
    n, k = SHAPES[name]
    cold = copies(lambda n_, k_: weights(n_, k_, GROUP, "cuda", compact=True), n, k)
    hot = [cold[0]] * len(cold)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    mb = nbytes(cold[0]) / 1e6
    ref = step_route(x, cold[0]).float()
    checks, rows = [], []
    for route, fn in [("step route", step_route)] + [(f"nibbles {c}", nibbles(c))
                                                      for c in launches]:
        try:
            diff = (fn(x, cold[0]).float() - ref).abs().max().item() / ref.abs().max().item()
            checks.append([name, route, f"{diff:.2e}"])
        except Exception as e:  # noqa: BLE001 - a launch that does not build: say so
            checks.append([name, route, f"failed: {type(e).__name__}: {str(e)[:80]}"])
            continue
        us = [timed(fn, s, x, iters) for s in (cold, hot)]
        rows.append([name, f"{n} x {k}", f"{mb:.1f}", route, *(f"{u:.1f}" for u in us),
                     f"{mb / us[0]:.2f}"])
    return checks, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="qkv,o,gate_up,down")
    ap.add_argument("--launches", default=LAUNCHES)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--write-best", metavar="FILE",
                    help="write ENGINE_W4_NIBBLES's value for the layers where a launch beat "
                    "the step route cold (each at its fastest launch)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    torch.manual_seed(0)
    launches = [tuple(int(v) for v in c.split(",")) for c in args.launches.split(";") if c]
    print(f"{torch.cuda.get_device_name()}: one row, us a product", flush=True)
    checks, rows = [], []
    for name in args.layers.split(","):
        c, r = layer_rows(name, launches, args.iters)
        checks += c
        rows += r
        table(["layer", "N x K", "MB", "route", "cold us", "hot us", "cold TB/s"], r)
    table(["layer", "route", "max diff / max |y| vs the step route"], checks)
    if args.write_best:
        with open(args.write_best, "w") as fh:
            fh.write(best_spec(rows) + "\n")


def best_spec(rows: list[list]) -> str:
    """``NxK:launch;...`` of the layers whose fastest launch (cold) beats the step route."""
    spec = []
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        base = [float(r[4]) for r in mine if r[3] == "step route"]
        tried = [(float(r[4]), r[3].removeprefix("nibbles ")) for r in mine
                 if r[3] != "step route"]
        if base and tried and min(tried)[0] < base[0]:
            launch = min(tried)[1].strip("()").replace(" ", "")
            spec.append(f"{mine[0][1].replace(' ', '')}:{launch}")
    return ";".join(spec)


if __name__ == "__main__":
    main()
