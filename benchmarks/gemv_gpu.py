"""Matrix-vector products of Llama-3-8B's linear layers at batch 1 (and a few rows) on a GPU:
the Triton kernels of :mod:`engine.runtime.gemv_triton` against cuBLAS (bf16) and the
``tl.dot`` kernels of :mod:`engine.runtime.quant_triton`, per weight format and layer shape,
with a launch-configuration search.

Each (format, shape) is timed as a decode step runs it: ``copies`` distinct weights (together
more than the L2 holds) multiplied one after the other inside one CUDA graph, replayed; the
time per product and the weight bytes it reads give TB/s. The step column adds up the four
layers x 32 (the linear layers of one decode step).

    python benchmarks/gemv_gpu.py [--formats bf16,fp8,...] [--rows 1] [--search]

``--search`` walks the launch configurations (block, split, warps, stages; for int4 also the
tiles per iteration, the factored rows and the code form of
:data:`engine.runtime.gemv_triton.AFFINE_CONFIGS`) coordinate by coordinate from the best of the
module's default and a few known-good launches, for each kernel, and prints the best per
(format, shape class: :func:`engine.runtime.quant_triton.shape_class`); for int4 at more rows it
then tries the group's affine factored out against not. int4 rows also time the per-weight
kernel before (``gemv-old``, at its launch then) next to ours.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

import torch

from engine.runtime import gemv_triton as gt
from engine.runtime import quant_triton as qt

sys.path.insert(0, os.path.dirname(__file__))
from quant_gpu import replay_ms  # noqa: E402

#: the layers of a decoder step by model (name -> [N, K]) and the model's layer count
MODELS = {"llama3-8b": ({"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                         "down": (4096, 14336)}, 32),
          # the attention half and the router (the experts go through the MoE runner)
          "qwen3-30b-a3b": ({"qkv": (5120, 2048), "o": (2048, 4096), "router": (128, 2048)},
                            48)}
SHAPES, LAYERS = MODELS["llama3-8b"]
BANDWIDTH = 4.3e12
L2_BYTES = 256 << 20  # copies of a layer: at least this much (several times the L2)


def make(fmt: str, n: int, k: int) -> dict:
    """One layer's weight in ``fmt`` (random codes; the products' values do not matter)."""
    dev = "cuda"
    if fmt == "bf16":
        return {"w": torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02}
    if fmt in ("fp8", "fp8_w8a16", "fp8_block"):
        w = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
        if fmt == "fp8_block":
            return {"w": w, "s": torch.rand(n // 128, k // 128, device=dev) * 0.01}
        return {"w": w, "s": torch.rand(n, device=dev) * 0.01}
    if fmt == "int8":
        return {"w": torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8),
                "s": torch.rand(n, device=dev) * 0.01}
    if fmt == "int4":
        codes = torch.randint(0, 16, (n, k), device=dev)
        return {"q": qt.pack_affine(codes, 4, 32), "s": torch.rand(k // 128, n, device=dev),
                "b": torch.rand(k // 128, n, device=dev)}
    raise ValueError(fmt)


def nbytes(t: dict) -> int:
    return sum(v.numel() * v.element_size() for v in t.values())


#: the launches the kernels before these used for one row (the ``tl.dot`` kernel, the row
#: padded to 16: the 16-row entries of the launch tables then)
OLD = {"a16": (32, 256, 1, 4, 4), "a8": (32, 256, 1, 4, 4), "block": (32, 128, 1, 4, 4)}
#: the per-weight affine kernel (TILES 0: ``_gemv_affine_ref``) at the launches it had
OLD_AFFINE = {"square": (32, 4, 2, 2, 0, 0, 0), "wide": (32, 4, 2, 2, 0, 0, 0),
              "deep": (32, 4, 4, 2, 0, 0, 0)}


def w8_kind(fmt: str) -> str:
    return {"fp8_w8a16": "a16", "fp8_block": "block"}.get(fmt, "a8")


def product(fmt: str, impl: str, config=None):
    """A function (x, weight dict) -> y for ``fmt`` by ``impl``: "ref" (cuBLAS for bf16, the
    kernels before these for the others), "gemv" (elementwise) or "dot" (``tl.dot``)."""
    act = {"fp8": "token", "int8": "token", "fp8_block": "group"}.get(fmt)
    block = (128, 128) if fmt == "fp8_block" else None
    if fmt == "bf16":
        if impl == "ref":
            return lambda x, t: torch.nn.functional.linear(x, t["w"])
        return lambda x, t: gt.gemv(x, t["w"], config=config)
    if fmt == "int4":
        if impl == "ref":
            def ref(x, t):
                saved, qt.GEMV_ROWS = qt.GEMV_ROWS, 0
                try:
                    return qt.affine_mm(x, t["q"], t["s"], t["b"], 4, 128, 32)
                finally:
                    qt.GEMV_ROWS = saved
            return ref
        return lambda x, t: gt.gemv_affine(x, t["q"], t["s"], t["b"], 4, 128, 32,
                                           config=config)
    if impl == "ref":
        impl, config = "dot", OLD[w8_kind(fmt)]
    return lambda x, t: qt.w8_mm(x, t["w"], t["s"], act=act, block=block, path=impl,
                                 config=config)


def time_us(fn, sets: list[dict], x: torch.Tensor, iters: int = 20) -> float:
    def run():
        for t in sets:
            fn(x, t)

    return replay_ms(run, iters) * 1e3 / len(sets)


def check(fmt: str, sets: list[dict], x: torch.Tensor, impl: str, config) -> float:
    """Relative max difference of ``impl`` against the reference product."""
    want = product(fmt, "ref")(x, sets[0]).float()
    got = product(fmt, impl, config)(x, sets[0]).float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-9)).item()


def default(fmt: str, cls: str) -> tuple[str, tuple]:
    if fmt == "bf16":
        return "gemv", gt.CONFIGS[("float", cls)]  # (the class's: SHAPE_CONFIGS aside)
    if fmt == "int4":
        return "gemv", gt.AFFINE_CONFIGS[cls]
    return qt.W8_SMALL[(w8_kind(fmt), cls)]


def search(fmt: str, impl: str, shapes: list[str], layers: dict, x: dict, cls: str,
           start: tuple | None = None, axes: list | None = None) -> tuple[float, tuple]:
    """Coordinate search of ``impl``'s launch for ``shapes`` (their summed time), from the
    default (or ``start``): each coordinate in turn takes its best value (int4: two passes;
    ``axes``: only these). (time us, configuration)."""
    if fmt == "int4":
        cfg = list(start or default(fmt, cls)[1])
        # (BLOCK_N, SPLIT_K, warps, stages: 2 prefetches, TILES, FACTOR_ROWS, SUBNORMAL);
        # BLOCK_N and TILES are capped by the warps (gemv_affine)
        axes = axes or 2 * [(4, (1, 2, 4)), (6, (0, 1)), (5, (0, 1)), (0, (16, 32, 64, 128)),
                            (2, (2, 4, 8)), (1, (1, 2, 4, 8)), (3, (1, 2))]
    else:
        start = default(fmt, cls)
        cfg = list(start[1]) if start[0] == impl else (
            [8, 1024, 1, 4, 3] if impl == "gemv" else [16, 512, 1, 4, 2])
        ks = (128,) if fmt == "fp8_block" else (256, 512, 1024, 2048)
        ns = (2, 4, 8, 16, 32) if impl == "gemv" else (16, 32, 64)
        axes = [(0, ns), (1, ks), (2, (1, 2, 4, 8)), (3, (2, 4, 8)), (4, (1, 2, 3, 4))]
    cache: dict[tuple, float] = {}

    def cost(c: tuple) -> float:
        if c not in cache:
            try:
                cache[c] = sum(time_us(product(fmt, impl, c), layers[s], x[s], iters=10)
                               for s in shapes)
            except Exception as e:  # noqa: BLE001 - a configuration that does not compile
                print(f"  {fmt} {impl} {c}: {type(e).__name__}: {str(e)[:80]}", flush=True)
                cache[c] = math.inf
        return cache[c]

    if fmt == "int4" and start is None:  # the best of a few launches with 16 words a thread
        seeds = [tuple(cfg), (32, 4, 4, 2, 2, 1, 1), (64, 4, 8, 2, 2, 1, 1),
                 (64, 4, 4, 2, 1, 1, 1), (32, 8, 4, 2, 2, 1, 1), (128, 2, 8, 2, 1, 1, 1),
                 # no split of K (no partial sums, no last-program reduction at the tail),
                 # narrow output blocks for programs enough: for the small q/k/v and o layers
                 (16, 1, 4, 2, 4, 1, 1), (32, 1, 4, 2, 4, 1, 1), (16, 1, 2, 2, 4, 1, 1)]
        cfg = list(min(seeds, key=cost))
    elif fmt != "int4":  # start from the best of a few known-good launches
        seeds = [tuple(cfg)] + ([(8, 1024, 1, 4, 3), (16, 512, 2, 4, 3)] if impl == "gemv" else
                                [(32, 256, 1, 4, 4), (16, 512, 1, 4, 2), (64, 128, 8, 2, 3)])
        if fmt == "fp8_block":
            seeds = [c[:1] + (128,) + c[2:] for c in seeds]
        cfg = list(min(seeds, key=cost))
    for i, values in axes:
        cfg[i] = min(values, key=lambda v: cost(tuple(cfg[:i] + [v] + cfg[i + 1:])))
    best = tuple(cfg)
    print(f"search {fmt} {impl} {cls} ({','.join(shapes)}): best {best} "
          f"{cost(best):.1f} us; {len(cache)} tried", flush=True)
    return cost(best), best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="bf16,fp8_w8a16,fp8,int8,fp8_block,int4")
    ap.add_argument("--rows", default="1")
    ap.add_argument("--search", action="store_true")
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS),
                    help="whose layer shapes (a search then gives launches for "
                    "gemv_triton.SHAPE_CONFIGS where the class's launch does not suit them)")
    args = ap.parse_args()
    global SHAPES, LAYERS
    SHAPES, LAYERS = MODELS[args.model]
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    torch.manual_seed(0)
    print("| format | rows | layer | bytes MB | reference us | ours: kernel, launch | ours us | "
          "ours TB/s | speed-up | max rel diff |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    summary = []
    found: dict[str, tuple] = {}  # int4: class -> the launch a one-row search chose
    for fmt, rows in itertools.product(args.formats.split(","),
                                       [int(r) for r in args.rows.split(",")]):
        layers, xs = {}, {}
        for name, (n, k) in SHAPES.items():
            first = make(fmt, n, k)
            copies = max(2, -(-L2_BYTES // nbytes(first)))
            layers[name] = [first] + [make(fmt, n, k) for _ in range(copies - 1)]
            xs[name] = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        chosen = {name: default(fmt, qt.shape_class(n, k)) for name, (n, k) in SHAPES.items()}
        if fmt == "int4":
            chosen.update({name: found[qt.shape_class(n, k)] for name, (n, k) in SHAPES.items()
                           if qt.shape_class(n, k) in found})
        for cls in ("square", "wide", "deep") if args.search else ():
            group = [s for s, (n, k) in SHAPES.items() if qt.shape_class(n, k) == cls]
            if not group:
                continue
            if rows == 1:
                impls = ("gemv",) if fmt in ("bf16", "int4") else ("gemv", "dot")
                best = min(search(fmt, impl, group, layers, xs, cls) + (impl,)
                           for impl in impls)
                if fmt == "int4":
                    found[cls] = (best[2], best[1])
            elif fmt == "int4":  # the one-row launch with the group's affine factored out
                # at this many rows, or not
                start = chosen[group[0]][1]
                best = search(fmt, "gemv", group, layers, xs, cls, start=start,
                              axes=[(5, (min(start[5], rows - 1), rows))]) + ("gemv",)
            else:
                continue
            for s in group:
                chosen[s] = (best[2], best[1])
        ref_step = gemv_step = old_step = 0.0
        for name, (n, k) in SHAPES.items():
            b = nbytes(layers[name][0])
            runs = [chosen[name]]
            if fmt == "int4":  # the per-weight kernel before, side by side
                runs.append(("gemv-old", OLD_AFFINE[qt.shape_class(n, k)]))
            ref = time_us(product(fmt, "ref"), layers[name], xs[name])
            ref_step += ref * LAYERS
            for impl, cfg in runs:
                kernel = "gemv" if impl == "gemv-old" else impl
                ours = time_us(product(fmt, kernel, cfg), layers[name], xs[name])
                diff = check(fmt, layers[name], xs[name], kernel, cfg)
                if impl == "gemv-old":
                    old_step += ours * LAYERS
                else:
                    gemv_step += ours * LAYERS
                print(f"| {fmt} | {rows} | {name} | {b / 1e6:.1f} | {ref:.1f} | {impl} {cfg} | "
                      f"{ours:.1f} | {b / ours / 1e6:.2f} | {ref / ours:.2f}x | {diff:.2e} |",
                      flush=True)
        summary.append((fmt, rows, ref_step / 1e3, gemv_step / 1e3))
        if fmt == "int4":
            summary.append((fmt + " gemv-old", rows, ref_step / 1e3, old_step / 1e3))
        del layers
        torch.cuda.empty_cache()
    print("\n| format | rows | step ms, reference | step ms, ours |")
    print("|---|---|---|---|")
    for fmt, rows, ref, ours in summary:
        print(f"| {fmt} | {rows} | {ref:.3f} | {ours:.3f} |")


if __name__ == "__main__":
    main()
