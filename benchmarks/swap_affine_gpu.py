"""The swapped-operand affine product :func:`engine.runtime.swap_affine.affine_swap` on
Llama-3-8B's linear layers (int4 codes in groups of 128) at 1-2048 rows, against the current
path (:func:`engine.runtime.quant_triton.affine_mm`, with its routing of the day), bf16 cuBLAS
on a dense weight of the same shape, and dequantizing into a temporary then cuBLAS
(:func:`engine.runtime.quant_triton.dequant_affine`), on a GPU.

First a correctness check on the real shapes: ``affine_swap`` at its default launch against the
float64 product of the dequantized weights and against ``affine_mm`` (the largest difference
over the largest magnitude). Then the timing: each layer's weight is copied until the copies
hold more than the L2 (256 MB), the products of all copies are captured in one CUDA graph and
replayed (as a decode step runs them); microseconds per product, and TB/s as the packed bytes
(codes, scales and biases; bf16: the dense weight) over that time. The step lines add up the
four layers x 32 (the linear layers of one decode step) for each path.

    python benchmarks/swap_affine_gpu.py [--rows 1,4,16] [--layers qkv,o] [--group 128]
    python benchmarks/swap_affine_gpu.py --search [--rows 1,4] [--block-n 16:1,32:1,32:2]
        [--splits 1,2,4,8,16] [--min-tiles 1] [--max-warps 64]
    python benchmarks/swap_affine_gpu.py --dry-run   # the correctness part, tiny shapes, on a CPU
    python benchmarks/swap_affine_gpu.py --offline   # compile for sm_90 without a GPU, report

``--search`` times every launch (BLOCK_N, SPLIT_K, warps, stages, XSUM) of the sweep per
(layer, rows), prints the best next to the default of
:data:`engine.runtime.swap_affine.CONFIGS`, and a table to paste there (per shape class and
row bucket, the launch with the least summed time over the class's layers). Each launch
compiles once per row kind (one row, or several) in parallel where Triton compiles
asynchronously; launches that fail to compile or launch are skipped. About four minutes for
rows 1 and 4 on an H200. ``--dry-run`` runs under the Triton interpreter (set before Triton is
imported), with float16 activations (the interpreter's products of bfloat16 in ``affine_mm``
are wrong).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

if __name__ == "__main__" and "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from engine.runtime import quant_methods as qm  # noqa: E402
from engine.runtime import quant_triton as qt  # noqa: E402
from engine.runtime import swap_affine as sa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_gpu import L2_BYTES, SHAPES, nbytes  # noqa: E402
from swap_gpu import compile_all, table, timed  # noqa: E402

BITS, SUB = 4, 32
#: decoder layers of Llama-3-8B (a step runs each of the four linear layers this often)
LAYERS = 32
#: small stand-ins of the four layers for ``--dry-run`` (the same shape classes)
TINY = {"qkv": (384, 256), "o": (256, 256), "gate_up": (1088, 256), "down": (128, 512)}
#: shared memory of one program on an H200 (bytes), and what Triton may take beside the
#: pipelined tiles (layout conversions, the epilogue)
SMEM, SMEM_OTHER = 227 << 10, 16 << 10
#: multiprocessors of an H200 (programs beyond a few per multiprocessor are not swept)
SMS = 132


def weights(n: int, k: int, group: int, device: str, compact: bool = False) -> dict:
    """One layer's int4 weight: random codes packed as ``affine_mm`` takes them, scales and
    biases [K / group, N] as GPTQ makes them (``b = -zero * s``; ``compact``: 16-bit scales,
    in the compact form the loader keeps, ``quant_methods.compact_constants``)."""
    codes = torch.randint(0, 16, (n, k), device=device)
    groups = -(-k // group)
    s = torch.rand(groups, n, device=device) * 0.01 + 1e-3
    zero = torch.randint(0, 16, (groups, n), device=device).float()
    s = s.half().float() if compact else s
    b = -zero * s
    if compact:
        s, b = qm.compact_constants(s, b)
    return {"q": qt.pack_affine(codes, BITS, SUB), "s": s, "b": b}


def dense_weight(n: int, k: int, device: str) -> dict:
    return {"w": torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02}


def copies(make, n: int, k: int) -> list[dict]:
    """Distinct weights ``make(n, k)`` of one layer, together more than :data:`L2_BYTES`."""
    first = make(n, k)
    count = max(2, -(-L2_BYTES // nbytes(first)))
    return [first] + [make(n, k) for _ in range(count - 1)]


def swap(group: int, config: tuple | None = None):
    """(x, weight dict) -> y by :func:`affine_swap` at ``config`` (None: its default)."""
    return lambda x, t: sa.affine_swap(x, t["q"], t["s"], t["b"], BITS, group, SUB,
                                       config=config)


def current(group: int):
    """(x, weight dict) -> y by :func:`affine_mm` (gemv_affine up to 4 rows)."""
    return lambda x, t: qt.affine_mm(x, t["q"], t["s"], t["b"], BITS, group, SUB)


def dequant(group: int, k: int):
    """(x, weight dict) -> y by :func:`dequant_affine` into a temporary, then cuBLAS."""
    return lambda x, t: torch.nn.functional.linear(
        x, qt.dequant_affine(t["q"], t["s"], t["b"], BITS, group, SUB, k, x.dtype))


def dense(x: torch.Tensor, t: dict) -> torch.Tensor:
    """bf16 cuBLAS on a dense weight."""
    return torch.nn.functional.linear(x, t["w"])


def dequantized(t: dict, k: int, group: int) -> torch.Tensor:
    """The float64 weight [N, K] a weight dict stands for."""
    q = t["q"].to(torch.int64)
    n = q.shape[0]
    per = 32 // BITS
    shifts = torch.arange(per, device=q.device) * BITS
    codes = ((q.reshape(n, -1, 1, SUB) >> shifts.reshape(1, 1, per, 1)) & 15).reshape(n, -1)
    expand = lambda v: v.double().t().repeat_interleave(group, 1)[:, :k]  # noqa: E731
    return codes[:, :k].double() * expand(t["s"]) + expand(t["b"])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def correctness(rows_list, layers, shapes, group, device, dtype) -> list[list]:
    """Rows of the correctness table: affine_swap at its default launch against the float64
    product and against affine_mm."""
    out = []
    for name in layers:
        n, k = shapes[name]
        t = weights(n, k, group, device)
        w64 = dequantized(t, k, group)
        for rows in rows_list:
            x = torch.randn(rows, k, device=device, dtype=dtype)
            y = swap(group)(x, t)
            want = x.double() @ w64.t()
            out.append([rows, name, f"{n}x{k}", sa.default_config(n, k, rows),
                        f"{rel(y, want):.2e}", f"{rel(y, current(group)(x, t)):.2e}"])
        del w64
    return out


#: (BLOCK_N, warps) pairs of the sweep where ``--block-n`` gives them (fewer than 64 outputs
#: a program take the synchronous matrix instructions, ``mma.sync``, instead of the warp-group
#: ones); None: the default shapes below
BLOCK_NS: tuple | None = None
#: splits of K the sweep tries, the fewest tiles a slice may hold, and the most warps of
#: programs a multiprocessor (``--splits``, ``--min-tiles``, ``--max-warps``)
SPLITS, MIN_TILES, MAX_WARPS = (1, 2, 4, 8), 2, 32


def candidates(n: int, k: int, rows: int) -> list[tuple]:
    """The sweep's launches for ``rows`` rows of a weight [n, k]: BLOCK_N 64 (4 warps) or 128
    (4 or 8 warps), and for 32-64 rows 256 (8 warps: each program's activation slices, which
    grow with the rows, then serve twice the weights; with 128 rows it spills registers); SPLIT_K 1-8 with at least two tiles a
    slice and at most 8 programs a multiprocessor; 2-5 stages, no more buffered tiles than a
    slice has, fitting :data:`SMEM`; the row sums from registers or from the matrix unit (one
    row: or the groups in the product's columns, 16 or 8 of them)."""
    pack = 32 // BITS * SUB
    tiles = triton.cdiv(k, pack)
    out = []
    shapes = BLOCK_NS or ((64, 4), (128, 4), (128, 8)) + (((256, 8),) if 32 <= rows <= 64
                                                          else ())
    for bn, warps in shapes:
        for split in SPLITS:
            per_slice = triton.cdiv(tiles, split)
            # (at most MAX_WARPS warps of programs a multiprocessor)
            if (split > 1 and per_slice < MIN_TILES
                    or triton.cdiv(n, bn) * split * warps > MAX_WARPS * SMS):
                continue
            for stages, xsum in itertools.product((2, 3, 4, 5),
                                                  (0, 1, 2, 3) if rows == 1 else (0, 1)):
                # per stage: BLOCK_N words a row, and the activation operand's rows for each
                # slice
                tile_bytes = bn * SUB * 4 + 32 // BITS * sa.operand_rows(rows, xsum) * SUB * 2
                if stages - 1 > per_slice or (stages - 1) * tile_bytes + SMEM_OTHER > SMEM:
                    continue
                out.append((bn, split, warps, stages, xsum))
    return out


def precompile(configs: list[tuple], group: int, x: torch.Tensor, t: dict) -> None:
    """Compile ``affine_swap`` at every launch of ``configs`` for these rows
    (:func:`swap_gpu.compile_all`)."""
    compile_all(sa, "_affine_swap", [lambda c=c: swap(group, c)(x, t) for c in configs])


def sweep(rows: int, layers: list[str], sets: dict, xs: dict, group: int, iters: int,
          times: dict) -> list[list]:
    """Rows of the search table at ``rows``: every candidate launch timed on each layer
    (compiled first); ``times[(name, rows)]`` keeps every launch's time for the summary."""
    out = []
    for name in layers:
        n, k = SHAPES[name]
        configs = candidates(n, k, rows)
        precompile(configs, group, xs[name], sets[name][0])
        default = sa.default_config(n, k, rows)
        base = timed(swap(group), sets[name], xs[name], iters)
        found = {c: timed(swap(group, c), sets[name], xs[name], max(5, iters // 2))
                 for c in configs}
        found[default] = base
        times[(name, rows)] = found
        best = min(found, key=found.get)
        b = nbytes(sets[name][0])
        out.append([rows, name, default, f"{base:.1f}", best, f"{found[best]:.1f}",
                    f"{b / found[best] / 1e6:.2f}", len(found)])
        print(f"search rows={rows} {name}: default {default} {base:.1f} us, best {best} "
              f"{found[best]:.1f} us", flush=True)
    return out


def suggested(times: dict) -> dict:
    """Per (shape class, row bucket): the launch with the least summed time over the class's
    layers (launches timed on all of them)."""
    by_key: dict[tuple, list[dict]] = {}
    for (name, rows), found in times.items():
        key = (qt.shape_class(*SHAPES[name]), sa.rows_bucket(rows))
        by_key.setdefault(key, []).append(found)
    out = {}
    for key, founds in sorted(by_key.items()):
        common = set.intersection(*(set(f) for f in founds))
        out[key] = min(common, key=lambda c: sum(f[c] for f in founds))
    return out


class _Capture:
    """Stands in for the kernel while :func:`offline` runs ``affine_swap`` on CPU tensors: keeps
    each launch's arguments instead of launching."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _loop_stats(sass: str) -> tuple[int, dict]:
    """(instructions, opcode counts) of the longest loop (a backward branch) of an ``nvdisasm
    -c`` listing."""
    ins, labels, pending = [], {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            labels.update({name: addr for name in pending})
            pending = []
            ins.append((addr, re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip())))
    spans = [(labels[t.group(1)], a) for a, text in ins
             if (t := re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text))
             and labels.get(t.group(1), a + 1) < a]
    if not spans:
        return 0, {}
    lo, hi = max(spans, key=lambda s: s[1] - s[0])
    ops: dict[str, int] = {}
    for a, text in ins:
        if lo <= a <= hi:
            ops[text.split()[0]] = ops.get(text.split()[0], 0) + 1
    return sum(ops.values()), ops


def offline(rows_list, layers, group) -> None:
    """Compile each layer's default launch for an H200 (sm_90, programmatic dependent launch)
    with this Triton, without a GPU, and print registers, spills, shared memory, warp-group
    MMAs in the PTX, and the main loop's instructions per weight and thread with its integer
    operations (SASS by the nvdisasm Triton ships)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kinds = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
             torch.int32: "i32"}
    tool = lambda name: getattr(triton.knobs.nvidia, name).path  # noqa: E731
    rows_out = []
    for name in layers:
        n, k = SHAPES[name]
        for rows in rows_list:
            capture, kernel = _Capture(), sa._affine_swap
            sa._affine_swap = capture
            try:  # the launch of the real shape, traced on zero tensors (nothing runs)
                x = torch.zeros(rows, k, dtype=torch.bfloat16)
                q = torch.zeros(n, triton.cdiv(k, 32 // BITS * SUB) * SUB, dtype=torch.int32)
                s = torch.zeros(triton.cdiv(k, group), n)
                sa.affine_swap(x, q, s, s, BITS, group, SUB)
            finally:
                sa._affine_swap = kernel
            args, kwargs = capture.calls[0]
            warps, stages = kwargs.pop("num_warps"), kwargs.pop("num_stages")
            kwargs.update(PDL=True)
            sig, attrs = {}, {}
            for i, (arg, v) in enumerate(zip(kernel.arg_names, args)):
                if isinstance(v, torch.Tensor):
                    sig[arg] = "*" + kinds[v.dtype]
                    attrs[(i,)] = [["tt.divisibility", 16]]
                else:
                    sig[arg] = "i32"
                    if v % 16 == 0:
                        attrs[(i,)] = [["tt.divisibility", 16]]
            sig.update({key: "constexpr" for key in kwargs})
            ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=kwargs,
                                          attrs=attrs), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": warps, "num_stages": stages,
                                         "launch_pdl": True})
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "k.cubin")
                with open(path, "wb") as f:
                    f.write(ck.asm["cubin"])
                usage = subprocess.run([tool("cuobjdump"), "--dump-resource-usage", path],
                                       capture_output=True, text=True).stdout
                sass = subprocess.run([tool("nvdisasm"), "-c", path], capture_output=True,
                                      text=True).stdout
            regs = re.search(r"REG:(\d+)", usage)
            spill = re.search(r"STACK:(\d+).*LOCAL:(\d+)", usage)
            count, ops = _loop_stats(sass)
            per_thread = kwargs["BLOCK_N"] * 32 // BITS * SUB / (32 * warps)
            integer = sum(ops.get(op, 0) for op in ("LOP3.LUT", "SHF.R.U32.HI", "PRMT"))
            rows_out.append([rows, name, sa.default_config(n, k, rows),
                             regs.group(1) if regs else "?",
                             f"{spill.group(1)}/{spill.group(2)}" if spill else "?",
                             ck.metadata.shared, len(re.findall(r"wgmma.mma_async",
                                                                ck.asm["ptx"])),
                             f"{count / per_thread:.2f}", f"{integer / per_thread:.2f}",
                             sum(v for op, v in ops.items() if op.startswith("HGMMA"))])
    table(["rows", "layer", "launch", "registers", "stack/local bytes", "shared bytes",
           "wgmma in PTX", "loop instructions / weight", "LOP3+SHF+PRMT / weight",
           "HGMMA in loop"], rows_out)


def dry_run(rows_list, layers, group) -> None:
    """The correctness part on tiny shapes under the interpreter, and the first and last
    launch of the sweep; fails when a difference exceeds 2^-7 (a unit of bfloat16)."""
    torch.manual_seed(0)
    result = correctness(rows_list, layers, TINY, group, "cpu", torch.float16)
    n, k = TINY["down"]
    t = weights(n, k, group, "cpu")
    w64 = dequantized(t, k, group)
    x = torch.randn(3, k, dtype=torch.float16)
    for c in (candidates(n, k, 3)[0], candidates(n, k, 3)[-1]):
        y = swap(group, c)(x, t)
        result.append([3, "down", f"{n}x{k}", c, f"{rel(y, x.double() @ w64.t()):.2e}",
                       f"{rel(y, current(group)(x, t)):.2e}"])
    table(["rows", "layer", "N x K", "swap launch", "max rel diff vs float64",
           "max rel diff vs affine_mm"], result)
    bad = [r for r in result if max(float(r[-1]), float(r[-2])) > 2 ** -7]
    sweep_sizes = {name: len(candidates(*SHAPES[name], 1)) for name in layers}
    print(f"\nlaunches swept per (layer, rows): {sweep_sizes}")
    if bad:
        sys.exit(f"dry run: {len(bad)} differences above 2^-7")
    print("dry run: ok")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=None,
                    help="row counts (default 1,4,16,32,64,128,512,2048; search: 1,4)")
    ap.add_argument("--layers", default=",".join(SHAPES))
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--search", action="store_true", help="sweep affine_swap's launches")
    ap.add_argument("--block-n", help="BLOCK_N:warps pairs of the sweep, e.g. 16:1,32:1,32:2")
    ap.add_argument("--splits", default="1,2,4,8", help="splits of K the sweep tries")
    ap.add_argument("--min-tiles", type=int, default=2, help="fewest tiles a split slice holds")
    ap.add_argument("--max-warps", type=int, default=32,
                    help="most warps of a launch's programs a multiprocessor")
    ap.add_argument("--iters", type=int, default=20, help="graph replays per timing")
    ap.add_argument("--dry-run", action="store_true",
                    help="correctness on tiny shapes under the Triton interpreter (CPU)")
    ap.add_argument("--offline", action="store_true",
                    help="compile the default launches for sm_90 without a GPU and report")
    args = ap.parse_args()
    global BLOCK_NS, SPLITS, MIN_TILES, MAX_WARPS
    if args.block_n:
        BLOCK_NS = tuple(tuple(int(v) for v in p.split(":")) for p in args.block_n.split(","))
    SPLITS = tuple(int(v) for v in args.splits.split(","))
    MIN_TILES, MAX_WARPS = args.min_tiles, args.max_warps
    rows_list = [int(r) for r in (args.rows or ("1,4" if args.search
                                                else "1,4,16,32,64,128,512,2048")).split(",")]
    layers = args.layers.split(",")
    if args.dry_run:
        dry_run(rows_list, layers, args.group)
        return
    if args.offline:
        offline(rows_list, layers, args.group)
        return
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU (or --dry-run)")
        return
    torch.manual_seed(0)
    checked = correctness(rows_list, layers, SHAPES, args.group, "cuda", torch.bfloat16)
    table(["rows", "layer", "N x K", "swap launch", "max rel diff vs float64",
           "max rel diff vs affine_mm"], checked)
    bad = [r for r in checked if max(float(r[-1]), float(r[-2])) > 2 ** -7]
    print(f"\ncorrectness: {len(bad)} differences above 2^-7" if bad else "\ncorrectness: ok")

    group = args.group
    timing, found, steps = [], [], []
    times: dict[tuple, dict] = {}
    dense_us: dict[tuple, float] = {}
    sets = {name: copies(lambda n, k: weights(n, k, group, "cuda"), *SHAPES[name])
            for name in layers}
    for rows in rows_list:
        xs = {name: torch.randn(rows, SHAPES[name][1], device="cuda", dtype=torch.bfloat16)
              for name in layers}
        if args.search:
            found += sweep(rows, layers, sets, xs, group, args.iters, times)
        step = [0.0, 0.0, 0.0, 0.0]
        for name in layers:
            n, k = SHAPES[name]
            b = nbytes(sets[name][0])
            if (name, rows) not in dense_us:
                dense_sets = copies(lambda n_, k_: dense_weight(n_, k_, "cuda"), n, k)
                dense_us[(name, rows)] = timed(dense, dense_sets, xs[name], args.iters)
                del dense_sets
            ours = timed(swap(group), sets[name], xs[name], args.iters)
            cur = timed(current(group), sets[name], xs[name], args.iters)
            deq = timed(dequant(group, k), sets[name], xs[name], args.iters)
            bf = dense_us[(name, rows)]
            for i, us in enumerate((ours, cur, bf, deq)):
                step[i] += us * LAYERS
            timing.append([rows, name, f"{b / 1e6:.1f}", sa.default_config(n, k, rows),
                           f"{ours:.1f}", f"{b / ours / 1e6:.2f}", f"{cur:.1f}",
                           f"{b / cur / 1e6:.2f}", f"{deq:.1f}", f"{bf:.1f}",
                           f"{2 * n * k / bf / 1e6:.2f}", f"{ours / bf:.2f}", f"{cur / bf:.2f}",
                           f"{deq / bf:.2f}"])
        steps.append([rows, f"{step[0] / 1e3:.2f}", f"{step[1] / 1e3:.2f}",
                      f"{step[3] / 1e3:.2f}", f"{step[2] / 1e3:.2f}",
                      f"{step[0] / step[2]:.2f}", f"{step[1] / step[2]:.2f}",
                      f"{step[3] / step[2]:.2f}"])
    if found:
        table(["rows", "layer", "default launch", "default us", "best launch", "best us",
               "best TB/s", "tried"], found)
        print("\nsuggested swap_affine.CONFIGS entries (least summed time per class):")
        for key, c in suggested(times).items():
            print(f"    {key}: {c},")
    table(["rows", "layer", "weight MB", "swap launch", "swap us", "swap TB/s", "affine_mm us",
           "affine_mm TB/s", "dequant + cuBLAS us", "bf16 cuBLAS us", "bf16 TB/s",
           "swap / bf16", "affine_mm / bf16", "dequant / bf16"], timing)
    table(["rows", "step's linear layers: swap ms", "affine_mm ms", "dequant + cuBLAS ms",
           "bf16 ms", "swap / bf16", "affine_mm / bf16", "dequant / bf16"], steps)


if __name__ == "__main__":
    main()
