"""The 4-bit step's packed words streamed alone, in the step's order and launched as its
products are: how close any one-row 4-bit kernel with this launch sequence could come to the
W4A16 target (a bound), on a GPU.

Llama-3-8B's decode step has 128 one-row products (q/k/v, o, gate/up and down, 32 layers). In
4-bit codes with groups of 128 each carries its words [N, K / 8] (int32) and its constants
(scale and offset, 16 bits each, [K / 128, N]: one int32 a group and output here). One kernel
a product adds up the words and constants its programs own (no activations, no products) and
stores one sum a program; a program owns BLOCK_N rows and one of SPLIT slices of K, read as
tiles of BLOCK_N rows x 32 words, UNROLL tiles a loop iteration. Kernels are chained by PDL (as
the products are) and the four layers' copies (past the L2 together) replay in one CUDA graph;
the step is the time a copy x 32. Three forms:

- ``after``: every load after the wait for the previous kernel, as a product that needs its
  activations first;
- ``first``: the slice's first UNROLL tiles loaded into registers before the wait (what a
  product can do with the words alone), the rest after;
- ``before``: every load before the wait: a chain of pure reads, the floor of this sequence.

Each layer's launch is chosen by its own time in the ``after`` form (``--launches`` lists the
candidates). The sums are checked against PyTorch's. Set against ``quant_gpu.py --batches 1
--schemes gptq,awq`` (the shipped products) and its bf16 row in the same call: the W4A16 target
is 0.4x of bf16.

    python3 benchmarks/w4_bound_gpu.py [--launches 64x1x4,128x8x4,...] [--copies 6]
    TRITON_INTERPRET=1 python3 benchmarks/w4_bound_gpu.py --check-only   (tiny, on a CPU)
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from engine.runtime.triton_pdl import launch_options, pdl_trigger, pdl_wait

#: Llama-3-8B's one-row products (N, K), in the step's order
LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
STEP_LAYERS = 32
CW = 32  # words a row in a tile (128 bytes)
GROUP = 128
FORMS = {"after": 0, "first": 1, "before": 2}
LAUNCHES = ",".join(f"{bn}x{s}x{u}" for bn, s, u in itertools.product(
    (64, 128), (1, 2, 4, 8), (2, 4)))


@triton.jit
def _tiles(base, c_rows, t0, t1, G_PER_TILE: tl.constexpr, CW: tl.constexpr,
           UNROLL: tl.constexpr, N):
    """Sum [BLOCK_N, CW] of the tiles ``t0 .. t1 - 1`` (UNROLL a step) and their groups'
    constants."""
    acc = tl.zeros(base.shape, tl.int32)
    for t in range(t0, t1, UNROLL):
        for u in tl.static_range(UNROLL):
            acc += tl.load(base + (t + u) * CW, cache_modifier=".cg")
            for g in tl.static_range(G_PER_TILE):
                acc += tl.load(c_rows + ((t + u) * G_PER_TILE + g) * N)[:, None]
    return acc


@triton.jit
def _w4_stream(w_ptr, c_ptr, out_ptr, N, KW, TILES, BLOCK_N: tl.constexpr, CW: tl.constexpr,
               UNROLL: tl.constexpr, G_PER_TILE: tl.constexpr, FORM: tl.constexpr,
               PDL: tl.constexpr):
    pdl_trigger(PDL)
    p = tl.program_id(0)
    s = tl.program_id(1)
    rows = p * BLOCK_N + tl.arange(0, BLOCK_N)
    base = w_ptr + rows.to(tl.int64)[:, None] * KW + tl.arange(0, CW)[None, :]
    c_rows = c_ptr + rows
    t0 = s * TILES
    t1 = t0 + TILES
    if FORM == 2:  # every load before the wait
        acc = _tiles(base, c_rows, t0, t1, G_PER_TILE, CW, UNROLL, N)
        pdl_wait(PDL)
    elif FORM == 1:  # the first UNROLL tiles before it, the rest after
        acc = _tiles(base, c_rows, t0, t0 + UNROLL, G_PER_TILE, CW, UNROLL, N)
        pdl_wait(PDL)
        acc += _tiles(base, c_rows, t0 + UNROLL, t1, G_PER_TILE, CW, UNROLL, N)
    else:  # every load after it
        pdl_wait(PDL)
        acc = _tiles(base, c_rows, t0, t1, G_PER_TILE, CW, UNROLL, N)
    tl.store(out_ptr + s * tl.num_programs(0) + p, tl.sum(tl.sum(acc, axis=1), axis=0))


def stream(w: torch.Tensor, c: torch.Tensor, out: torch.Tensor, launch: tuple[int, int, int],
           form: int) -> None:
    """One product's words ``w`` [N, KW] and constants ``c`` [G, N] summed by programs of
    ``launch`` (BLOCK_N, SPLIT, UNROLL) into ``out`` [SPLIT, N / BLOCK_N]."""
    bn, split, unroll = launch
    n, kw = w.shape
    tiles = kw // CW // split
    _w4_stream[(n // bn, split)](w, c, out, n, kw, tiles, BLOCK_N=bn, CW=CW, UNROLL=unroll,
                                 G_PER_TILE=CW * 8 // GROUP, FORM=form, num_warps=4,
                                 num_stages=1, **launch_options(w.device))


def fits(n: int, kw: int, launch: tuple[int, int, int]) -> bool:
    bn, split, unroll = launch
    return n % bn == 0 and kw % (CW * split) == 0 and (kw // CW // split) % unroll == 0


def want_sums(w: torch.Tensor, c: torch.Tensor) -> int:
    """What the programs' sums add up to (mod 2^32): every word once, every constant once a
    column of a tile's row (added to the whole [BLOCK_N, CW] sum)."""
    return int((w.to(torch.int64).sum() + CW * c.to(torch.int64).sum()) % 2 ** 32)


def got_sums(out: torch.Tensor) -> int:
    return int(out.to(torch.int64).sum() % 2 ** 32)


def layer(n: int, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    kw = k // 8
    w = torch.randint(0, 1 << 30, (n, kw), dtype=torch.int32, device=device)
    c = torch.randint(0, 1 << 30, (k // GROUP, n), dtype=torch.int32, device=device)
    return w, c


def check_only() -> None:
    """Tiny layers under the interpreter: every form's sums against PyTorch's."""
    for (n, k), launch, form in itertools.product(((128, 1024), (64, 2048)),
                                                  ((64, 1, 2), (64, 2, 1), (32, 4, 1)),
                                                  FORMS.values()):
        if not fits(n, k // 8, launch):
            continue
        w, c = layer(n, k, "cpu")
        out = torch.zeros(launch[1], n // launch[0], dtype=torch.int32)
        stream(w, c, out, launch, form)
        if got_sums(out) != want_sums(w, c):
            raise SystemExit(f"{n} x {k} {launch} form {form}: sums differ")
    print("sums agree")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", default=LAUNCHES, help="BLOCK_N x SPLIT x UNROLL, ...")
    ap.add_argument("--copies", type=int, default=6, help="copies of the four layers")
    ap.add_argument("--check-only", action="store_true", help="tiny shapes, sums only")
    args = ap.parse_args()
    if args.check_only:
        check_only()
        return
    from quant_gpu import replay_ms

    launches = [tuple(int(v) for v in s.split("x")) for s in args.launches.split(",")]
    sets = {name: [layer(n, k, "cuda") for _ in range(args.copies)]
            for name, (n, k) in LAYERS.items()}
    rows, best = [], {}
    for name, (n, k) in LAYERS.items():
        kw = k // 8
        nbytes = (n * kw + k // GROUP * n) * 4
        timed = []
        for launch in (lt for lt in launches if fits(n, kw, lt)):
            out = torch.zeros(launch[1], n // launch[0], dtype=torch.int32, device="cuda")
            w, c = sets[name][0]
            stream(w, c, out, launch, 0)
            if got_sums(out) != want_sums(w, c):
                raise SystemExit(f"{name} {launch}: sums differ")

            def run(launch=launch, out=out, name=name):
                for w, c in sets[name]:
                    stream(w, c, out, launch, 0)

            us = min(replay_ms(run) for _ in range(3)) * 1e3 / args.copies
            timed.append((us, launch))
        us, launch = min(timed)
        best[name] = launch
        rows.append((name, f"{n} x {k}", f"{nbytes / 1e6:.1f}", "x".join(map(str, launch)),
                     f"{us:.1f}", f"{nbytes / us / 1e6:.2f}"))
    print(f"{torch.cuda.get_device_name()}: each layer alone, the 'after' form at its best "
          f"launch of {len(launches)}")
    print("| layer | N x K | MB | BLOCK_N x SPLIT x UNROLL | us | TB/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    outs = {name: torch.zeros(best[name][1], LAYERS[name][0] // best[name][0],
                              dtype=torch.int32, device="cuda") for name in LAYERS}
    step_bytes = sum((n * k // 8 + k // GROUP * n) * 4 for n, k in LAYERS.values())
    print(f"\nthe step ({STEP_LAYERS} layers, {step_bytes * STEP_LAYERS / 1e9:.2f} GB), "
          "kernels chained by PDL in one graph")
    print("| form | ms a step | TB/s |")
    print("|---|---|---|")
    for form_name, form in FORMS.items():
        def run(form=form):
            for i in range(args.copies):
                for name in LAYERS:
                    w, c = sets[name][i]
                    stream(w, c, outs[name], best[name], form)

        ms = min(replay_ms(run) for _ in range(3)) / args.copies * STEP_LAYERS
        print(f"| {form_name} | {ms:.3f} | {step_bytes * STEP_LAYERS / ms / 1e9:.2f} |")


if __name__ == "__main__":
    main()
