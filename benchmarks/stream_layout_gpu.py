"""How fast a GPU streams a packed weight matrix with the one-row 4-bit products' access pattern,
against the same bytes laid out so that each tile a program reads is one contiguous run.

The 4-bit one-row kernels read their int32 words [N, K / 8] (rows of K / 8 words, K
contiguous) as tiles of BLOCK_N rows x CW words a loop iteration: 128 bytes of each of 64-128
rows that lie a row's length apart, the row's 2 KB (K 4096) read in 16 pieces. The 8-bit and
bf16 products read long runs of each row. This script times a kernel that only adds the words
up (no products), so that the difference between the layouts is the memory system's alone:

- ``rows``: program p reads rows [p BLOCK_N, (p + 1) BLOCK_N) tile by tile along K, as the
  4-bit kernels do;
- ``tiled``: the same number of programs, tiles and bytes, but tile t of program p is the
  contiguous run at ``(p * tiles + t) * BLOCK_N * CW`` (the words laid out again at load time so
  that each tile is one run);
- ``UNROLL`` tiles a loop iteration (so many tiles' loads in flight a warp: the row length is
  a run-time argument and the loop is not pipelined, so the compiler cannot issue more).

Every variant reads each word once, so their sums agree (checked). The buffer's copies are past
the L2 together (``read_gpu.buffers``; each launch reads another), replayed in one CUDA graph
(``quant_gpu.replay_ms``); TB/s of words read. ``benchmarks/read_gpu.py`` gives the contiguous
read's ceiling at each size.

    python3 benchmarks/stream_layout_gpu.py [--n 28672] [--k 4096] [--configs ...]
    TRITON_INTERPRET=1 python3 benchmarks/stream_layout_gpu.py --check-only  (tiny, on a CPU)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from quant_gpu import replay_ms


@triton.jit
def _stream(w_ptr, out_ptr, KW, BLOCK_N: tl.constexpr, CW: tl.constexpr,
            UNROLL: tl.constexpr, TILED: tl.constexpr):
    p = tl.program_id(0)
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, CW)
    if TILED:
        tile = BLOCK_N * CW
        base = w_ptr + p.to(tl.int64) * BLOCK_N * KW + r[:, None] * CW + c[None, :]
    else:
        tile = CW
        base = w_ptr + (p.to(tl.int64) * BLOCK_N + r)[:, None] * KW + c[None, :]
    acc = tl.zeros([BLOCK_N, CW], tl.int32)
    for t in range(0, KW // CW, UNROLL):
        for u in tl.static_range(UNROLL):
            acc += tl.load(base + (t + u) * tile, cache_modifier=".cg")
    tl.store(out_ptr + p, tl.sum(tl.sum(acc, axis=1), axis=0))


def stream(w: torch.Tensor, out: torch.Tensor, block_n: int, cw: int, unroll: int, tiled: bool,
           warps: int) -> None:
    n, kw = w.shape
    _stream[(n // block_n,)](w, out, kw, BLOCK_N=block_n, CW=cw, UNROLL=unroll, TILED=tiled,
                             num_warps=warps, num_stages=1)


def parse(spec: str) -> tuple[int, int, int, int]:
    """BLOCK_N x CW x UNROLL x warps"""
    bn, cw, un, wp = (int(v) for v in spec.split("x"))
    return bn, cw, un, wp


DEFAULT = ("128x32x1x4,128x32x2x4,128x32x4x4,64x32x2x4,64x32x4x4,16x32x4x4,16x32x8x4,"
           "8x512x1x4,8x256x2x8")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=28672)
    ap.add_argument("--k", type=int, default=4096, help="K of 4-bit codes (K / 8 words a row)")
    ap.add_argument("--configs", default=DEFAULT, help="BLOCK_N x CW x UNROLL x warps, ...")
    ap.add_argument("--check-only", action="store_true", help="tiny shapes, sums only")
    args = ap.parse_args()
    if args.check_only:
        n, kw, configs = 64, 64, ["16x16x2x4", "8x64x1x4"]
        ws = [torch.randint(0, 1 << 30, (n, kw), dtype=torch.int32)]
    else:
        from read_gpu import buffers

        n, kw, configs = args.n, args.k // 8, args.configs.split(",")
        ws = [b.view(n, kw) for b in buffers(n * kw)]  # (copies past the L2 together)
    want = int(ws[0].to(torch.int64).sum()) % 2 ** 32
    rows = []
    for spec in configs:
        bn, cw, un, wp = parse(spec)
        if n % bn or kw % (cw * un):
            print(f"{spec}: does not divide {n} x {kw}, skipped")
            continue
        out = torch.zeros(n // bn, dtype=torch.int32, device=ws[0].device)
        for tiled in (False, True):
            out.zero_()
            stream(ws[0], out, bn, cw, un, tiled, wp)
            got = int(out.to(torch.int64).sum()) % 2 ** 32
            if got != want:
                raise SystemExit(f"{spec} tiled={tiled}: sum {got} != {want}")
            if args.check_only:
                continue

            def run(bn=bn, cw=cw, un=un, tiled=tiled, wp=wp):
                for w in ws:
                    stream(w, out, bn, cw, un, tiled, wp)

            us = min(replay_ms(run) for _ in range(5)) * 1e3 / len(ws)
            rows.append((spec, "tiled" if tiled else "rows", us, n * kw * 4 / us / 1e6))
    if args.check_only:
        print("sums agree")
        return
    print(f"{torch.cuda.get_device_name()}: {n} x {kw} int32 words "
          f"({n * kw * 4 / 1e6:.1f} MB), {len(ws)} copies")
    print("| BLOCK_N x CW x UNROLL x warps | layout | us | TB/s |")
    print("|---|---|---|---|")
    for spec, lay, us, tbs in rows:
        print(f"| {spec} | {lay} | {us:.1f} | {tbs:.2f} |")
    x, y = ws[0], ws[1]
    us = replay_ms(lambda: y.copy_(x)) * 1e3
    tbs = 2 * n * kw * 4 / us / 1e6
    print(f"| (a copy of the same bytes: read + write) | | {us:.1f} | {tbs:.2f} |")


if __name__ == "__main__":
    main()
