"""The swapped-operand 8-bit product :func:`engine.runtime.swap_triton.w8_swap` on Llama-3-8B's
linear layers at 1-16 rows, against :func:`engine.runtime.quant_triton.w8_mm` (the launch
:data:`engine.runtime.quant_triton.W8_SMALL` picks) and bf16 cuBLAS on a dense weight of the
same shape, on a GPU.

First a correctness check of ``w8_swap`` against ``w8_mm`` on the real shapes (the largest
difference over the largest magnitude of ``w8_mm``'s result), then the timing: each layer's
weight is copied until the copies hold more than the L2 (256 MB), the products of all copies
are captured in one CUDA graph and replayed (as a decode step runs them); microseconds per
product, and TB/s as the weight bytes read over that time. Formats: ``fp8`` (e4m3, per-row
scales, activations quantized per row), ``int8`` (the same in int8), ``fp8_w8a16``
(activations unquantized), ``fp8_block`` (128x128 block scales, activations per row and 128
columns), ``fp8_codes`` / ``int8_codes`` (the activations handed over as codes with their row
scales, made before the timed products: what a product costs when the kernel before it
quantizes; ``w8_mm`` then quantizes the rows itself).

    python benchmarks/swap_gpu.py [--formats fp8,int8,...] [--rows 1,4,16] [--layers qkv,o]
    python benchmarks/swap_gpu.py --search --formats fp8,int8 --rows 1,4
    python benchmarks/swap_gpu.py --search --formats fp8 --rows 1 --splits 1,3,5,6,11
    python benchmarks/swap_gpu.py --dry-run   # the correctness part, tiny shapes, on a CPU

``--search`` times every launch (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) of the sweep per
(format, layer, rows) and prints the best next to the launch the route takes now
(:data:`engine.runtime.swap_triton.SMALL`, else ``SWAP_CONFIGS``). Each launch compiles once per format and row
count (the layers share it), in parallel where Triton compiles asynchronously; launches whose
pipelined tiles do not fit in shared memory are skipped, as are any that fail to compile or
launch. ``--dry-run`` runs under the Triton interpreter (set before Triton is imported).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

if __name__ == "__main__" and "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from engine.runtime import quant_triton as qt  # noqa: E402
from engine.runtime import swap_triton as st  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_gpu import L2_BYTES, SHAPES, nbytes, time_us  # noqa: E402

#: format -> (weight dtype, activations, block scales)
FORMATS = {"fp8": (torch.float8_e4m3fn, "token", None),
           "int8": (torch.int8, "token", None),
           "fp8_w8a16": (torch.float8_e4m3fn, None, None),
           "fp8_block": (torch.float8_e4m3fn, "group", (128, 128)),
           "fp8_codes": (torch.float8_e4m3fn, "codes", None),
           "int8_codes": (torch.int8, "codes", None)}
#: (x's address, shape, codes' dtype) -> x, the codes and row scales ``quant_rows`` made of x,
#: outside the timed graph (made at the warm-up calls before the capture)
ROW_CODES: dict[tuple, tuple] = {}
#: small stand-ins of the four layers for ``--dry-run`` (the same shape classes)
TINY = {"qkv": (192, 128), "o": (128, 128), "gate_up": (544, 128), "down": (96, 384)}
#: shared memory of one program on an H200 (bytes), and what Triton may take beside the
#: pipelined tiles (layout conversions)
SMEM, SMEM_OTHER = 227 << 10, 16 << 10


def weights(fmt: str, n: int, k: int, device: str) -> dict:
    """One layer's weight in ``fmt`` ("bf16": dense) with random codes and scales."""
    if fmt == "bf16":
        return {"w": torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02}
    dtype, _, block = FORMATS[fmt]
    if dtype == torch.int8:
        w = torch.randint(-127, 128, (n, k), device=device, dtype=torch.int8)
    else:
        w = (torch.randn(n, k, device=device) * 64).clamp(-448, 448).to(dtype)
    shape = (n,) if block is None else (-(-n // block[0]), -(-k // block[1]))
    return {"w": w, "s": torch.rand(shape, device=device) * 0.01 + 1e-4}


def copies(fmt: str, n: int, k: int) -> list[dict]:
    """Distinct weights of one layer, together more than :data:`L2_BYTES`."""
    first = weights(fmt, n, k, "cuda")
    count = max(2, -(-L2_BYTES // nbytes(first)))
    return [first] + [weights(fmt, n, k, "cuda") for _ in range(count - 1)]


def row_codes(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes and row scales of ``x`` (made once: :data:`ROW_CODES`)."""
    key = (x.data_ptr(), tuple(x.shape), dtype)
    if key not in ROW_CODES:  # (x kept alive with them: its address is not reused)
        ROW_CODES[key] = (x, *qt.quant_rows(x, dtype))
    return ROW_CODES[key][1:]


def swap(fmt: str, config: tuple | None = None):
    """(x, weight dict) -> y by :func:`w8_swap` at ``config`` (None: its default)."""
    dtype, act, block = FORMATS[fmt]
    if act == "codes":
        def codes(x, t):
            xq, xs = row_codes(x, dtype)
            return st.w8_swap(xq, t["w"], t["s"], act="codes", x_scale=xs, config=config,
                              out_dtype=x.dtype)
        return codes
    return lambda x, t: st.w8_swap(x, t["w"], t["s"], act=act, block=block, config=config)


def w8_mm(fmt: str):
    """(x, weight dict) -> y by :func:`w8_mm` at the launch it picks itself (activation codes:
    quantized in the product, per row)."""
    _, act, block = FORMATS[fmt]
    act = "token" if act == "codes" else act
    return lambda x, t: qt.w8_mm(x, t["w"], t["s"], act=act, block=block)


def dense(x: torch.Tensor, t: dict) -> torch.Tensor:
    """bf16 cuBLAS on a dense weight."""
    return torch.nn.functional.linear(x, t["w"])


def rel_diff(fmt: str, t: dict, x: torch.Tensor, config: tuple | None = None) -> float:
    """max |w8_swap - w8_mm| / max |w8_mm| on one weight."""
    want = w8_mm(fmt)(x, t).float()
    got = swap(fmt, config)(x, t).float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def default_config(fmt: str, n: int, k: int, rows: int) -> tuple:
    """The launch ``w8_mm`` hands ``rows`` rows of this layer to (:data:`swap_triton.SMALL`;
    rows 0: none), else the kernel's own default (:data:`swap_triton.SWAP_CONFIGS`, which
    ``w8_swap`` takes without a launch)."""
    dtype, act, block = FORMATS[fmt]
    small = st.small_config(dtype, act, block, n, k, rows) if rows else None
    if small is not None:
        return small
    kind = "block" if block is not None else "a16" if act is None else "a8"
    return st.SWAP_CONFIGS[(kind, qt.shape_class(n, k))]


#: the sweep's axes (``--splits``, ``--block-k``, ``--stages``, ``--block-n`` replace them):
#: (BLOCK_N, warps) pairs, SPLIT_K, BLOCK_K, stages
BLOCK_NS = ((64, 4), (64, 8), (128, 4), (128, 8))
SPLITS, BLOCK_KS, STAGES = (1, 2, 4, 8), (64, 128, 256), (3, 4, 5, 6)


def candidates(fmt: str, k: int, rows: int = st.MAX_ROWS) -> list[tuple]:
    """The sweep's launches for a layer of depth ``k`` at ``rows``: (BLOCK_N, warps) of
    :data:`BLOCK_NS`; BLOCK_K of :data:`BLOCK_KS` (block fp8: the scale block's, 1, 2 or 4 of
    them an iteration: a sixth element SUB where more than one); SPLIT_K of :data:`SPLITS`,
    each slice at least two iterations; :data:`STAGES`, whose buffered weight and activation
    tiles (one fewer than the stages; the rows padded to their block) fit in :data:`SMEM`."""
    _, act, block = FORMATS[fmt]
    x_bytes = 1 if act in ("token", "codes") else 2  # (codes, or 16-bit activations)
    out = []
    for bn, warps in BLOCK_NS:
        for bk in (block[1],) if block else BLOCK_KS:
            for sub in (1, 2, 4) if block else (1,):
                for split in SPLITS:
                    if split > 1 and triton.cdiv(k, bk * sub) < 2 * split:
                        continue
                    for stages in STAGES:
                        tiles = (stages - 1) * (bn + st.rows_block(rows) * x_bytes) * bk * sub
                        if tiles + SMEM_OTHER <= SMEM:
                            out.append((bn, bk, split, warps, stages) + ((sub,) if sub > 1
                                                                         else ()))
    return out


class _Warmup:
    """Stands in for a kernel while :func:`compile_all` runs: each launch only compiles
    (``warmup``), asynchronously under Triton's AsyncCompileMode."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel.warmup(*args, grid=grid, **kwargs)


def compile_all(module, name: str, launches: list) -> None:
    """Compile the kernel ``module.<name>`` at every launch of ``launches`` (callables that
    launch it), in parallel threads where this Triton has AsyncCompileMode (else each compiles
    when first timed; failures are left for the timing to skip)."""
    try:
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return
    kernel = getattr(module, name)
    setattr(module, name, _Warmup(kernel))
    try:
        with ThreadPoolExecutor(os.cpu_count() or 4) as pool, \
                AsyncCompileMode(pool, ignore_errors=True):
            for launch in launches:
                try:
                    launch()
                except Exception:  # noqa: BLE001 - compiled (and skipped) when timed
                    pass
    except Exception as e:  # noqa: BLE001 - an AsyncCompileMode unlike this one's
        print(f"  compiling in parallel failed ({type(e).__name__}: {str(e)[:80]}); "
              "compiling as timed", file=sys.stderr, flush=True)
    finally:
        setattr(module, name, kernel)


def precompile(fmt: str, configs: list[tuple], x: torch.Tensor, t: dict) -> None:
    """Compile ``w8_swap`` at every launch of ``configs`` for these rows (:func:`compile_all`)."""
    compile_all(st, "_w8_swap", [lambda c=c: swap(fmt, c)(x, t) for c in configs])


def timed(fn, sets: list[dict], x: torch.Tensor, iters: int) -> float:
    """us per product of ``fn`` over ``sets`` in one replayed graph (inf where the launch
    fails: out of resources, or does not compile)."""
    try:
        return time_us(fn, sets, x, iters)
    except Exception as e:  # noqa: BLE001
        print(f"  skipped: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        return math.inf


def table(head: list[str], rows: list[list]) -> None:
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(v) for v in r) + " |", flush=True)


def correctness(formats, rows_list, layers, shapes, device) -> list[list]:
    """Rows of the correctness table: w8_swap at its default launch against w8_mm."""
    gen_dtype = torch.float16 if device == "cpu" else torch.bfloat16
    out = []
    for fmt in formats:
        for name in layers:
            n, k = shapes[name]
            t = weights(fmt, n, k, device)
            for rows in rows_list:
                x = torch.randn(rows, k, device=device, dtype=gen_dtype)
                out.append([fmt, rows, name, f"{n}x{k}", default_config(fmt, n, k, 0),
                            f"{rel_diff(fmt, t, x):.2e}"])
    return out


def dry_run(formats, rows_list, layers) -> None:
    """The correctness part on tiny shapes under the interpreter, and two swept launches of
    each format; fails when a difference exceeds a few units of float16."""
    torch.manual_seed(0)
    result = correctness(formats, rows_list, layers, TINY, "cpu")
    for fmt in formats:
        n, k = TINY["down"]
        t = weights(fmt, n, k, "cpu")
        x = torch.randn(3, k, dtype=torch.float16)
        for c in (candidates(fmt, k)[0], candidates(fmt, k)[-1]):
            result.append([fmt, 3, "down", f"{n}x{k}", c, f"{rel_diff(fmt, t, x, c):.2e}"])
    table(["format", "rows", "layer", "N x K", "swap launch", "max rel diff vs w8_mm"], result)
    bad = [r for r in result if float(r[-1]) > 2 ** -8]
    sweep = {fmt: len(candidates(fmt, k)) for fmt in formats for _, k in [SHAPES["qkv"]]}
    print(f"\nlaunches swept per (format, layer, rows) at K=4096: {sweep}")
    if bad:
        sys.exit(f"dry run: {len(bad)} differences above 2^-8")
    print("dry run: ok")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="fp8,int8,fp8_w8a16,fp8_block")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--layers", default=",".join(SHAPES))
    ap.add_argument("--search", action="store_true", help="sweep w8_swap's launches")
    ap.add_argument("--iters", type=int, default=20, help="graph replays per timing")
    ap.add_argument("--splits", help="SPLIT_K values of the sweep (default 1,2,4,8)")
    ap.add_argument("--block-k", help="BLOCK_K values of the sweep (default 64,128,256)")
    ap.add_argument("--stages", help="pipeline stages of the sweep (default 3,4,5,6)")
    ap.add_argument("--block-n", help="BLOCK_N:warps pairs of the sweep (default 64:4,64:8,"
                    "128:4,128:8)")
    ap.add_argument("--write-launches", metavar="FILE",
                    help="with --search: the best launch of each (format, layer's class, rows) "
                    "as JSON, for quant_gpu.py --launches (the faster of two layers of one class)")
    ap.add_argument("--dry-run", action="store_true",
                    help="correctness on tiny shapes under the Triton interpreter (CPU)")
    args = ap.parse_args()
    global SPLITS, BLOCK_KS, STAGES, BLOCK_NS
    ints = lambda v: tuple(int(p) for p in v.split(","))  # noqa: E731
    SPLITS = ints(args.splits) if args.splits else SPLITS
    BLOCK_KS = ints(args.block_k) if args.block_k else BLOCK_KS
    STAGES = ints(args.stages) if args.stages else STAGES
    if args.block_n:
        BLOCK_NS = tuple(tuple(int(v) for v in p.split(":")) for p in args.block_n.split(","))
    formats = args.formats.split(",")
    rows_list = [int(r) for r in args.rows.split(",")]
    layers = args.layers.split(",")
    if args.dry_run:
        dry_run(formats, rows_list, layers)
        return
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU (or --dry-run)")
        return
    torch.manual_seed(0)
    table(["format", "rows", "layer", "N x K", "swap launch", "max rel diff vs w8_mm"],
          correctness(formats, rows_list, layers, SHAPES, "cuda"))

    timing, found = [], []
    dense_us: dict[tuple, float] = {}
    for fmt in formats:
        sets = {name: copies(fmt, *SHAPES[name]) for name in layers}
        for rows in rows_list:
            xs = {name: torch.randn(rows, SHAPES[name][1], device="cuda",
                                    dtype=torch.bfloat16) for name in layers}
            if args.search:
                found += sweep(fmt, rows, layers, sets, xs, args.iters)
            for name in layers:
                n, k = SHAPES[name]
                b = nbytes(sets[name][0])
                if (name, rows) not in dense_us:
                    dense_sets = copies("bf16", n, k)
                    dense_us[(name, rows)] = timed(dense, dense_sets, xs[name], args.iters)
                    del dense_sets
                ours = timed(swap(fmt), sets[name], xs[name], args.iters)
                mm = timed(w8_mm(fmt), sets[name], xs[name], args.iters)
                bf = dense_us[(name, rows)]
                timing.append([fmt, rows, name, f"{b / 1e6:.1f}", f"{ours:.1f}",
                               f"{b / ours / 1e6:.2f}", f"{mm:.1f}", f"{b / mm / 1e6:.2f}",
                               f"{bf:.1f}", f"{2 * n * k / bf / 1e6:.2f}", f"{mm / ours:.2f}x"])
        del sets
        torch.cuda.empty_cache()
    if found and args.write_launches:
        write_launches(args.write_launches, found)
    if found:
        table(["format", "rows", "layer", "default launch", "default us", "best launch",
               "best us", "best TB/s", "best, rows quantized in the kernel, us", "tried"],
              found)
    table(["format", "rows", "layer", "weight MB", "swap us", "swap TB/s", "w8_mm us",
           "w8_mm TB/s", "bf16 cuBLAS us", "bf16 TB/s", "swap speed-up vs w8_mm"], timing)


def write_launches(path: str, found: list[list]) -> None:
    """The search's best launches as {"codes,activations,class,bucket": launch} (JSON); where
    two layers share a class, the one whose best beat its default by more."""
    import json

    best: dict[str, tuple] = {}
    for fmt, rows, name, default, base, launch, us, *_ in found:
        key = ",".join(map(str, st.small_key(*FORMATS[fmt], *SHAPES[name], rows)))
        gain = float(base) - float(us)
        if key not in best or gain > best[key][0]:
            best[key] = (gain, list(launch))
    with open(path, "w") as f:
        json.dump({key: launch for key, (_, launch) in best.items()}, f, indent=1)
    print(f"launches written to {path}")


def sweep(fmt: str, rows: int, layers: list[str], sets: dict, xs: dict,
          iters: int) -> list[list]:
    """Rows of the search table for ``fmt`` at ``rows``: every candidate launch timed on each
    layer (compiled first, once for all layers); for per-row activations at several rows, the
    best launch also with the rows quantized inside the kernel instead of by ``quant_rows``
    first (:data:`engine.runtime.swap_triton.QUANT_ROWS_FROM`)."""
    out = []
    for name in layers:
        n, k = SHAPES[name]
        configs = candidates(fmt, k, rows)
        precompile(fmt, configs, xs[name], sets[name][0])
        default = default_config(fmt, n, k, rows)
        base = timed(swap(fmt, default), sets[name], xs[name], iters)
        times = {c: timed(swap(fmt, c), sets[name], xs[name], max(5, iters // 2))
                 for c in configs}
        best = min(times, key=times.get)
        in_kernel = "-"
        if FORMATS[fmt][1] == "token" and rows >= st.QUANT_ROWS_FROM:
            saved, st.QUANT_ROWS_FROM = st.QUANT_ROWS_FROM, st.MAX_ROWS + 1
            try:
                in_kernel = f"{timed(swap(fmt, best), sets[name], xs[name], iters):.1f}"
            finally:
                st.QUANT_ROWS_FROM = saved
        b = nbytes(sets[name][0])
        out.append([fmt, rows, name, default, f"{base:.1f}", best, f"{times[best]:.1f}",
                    f"{b / times[best] / 1e6:.2f}", in_kernel, len(times)])
        print(f"search {fmt} rows={rows} {name}: default {default} {base:.1f} us, best {best} "
              f"{times[best]:.1f} us", flush=True)
    return out


if __name__ == "__main__":
    main()
