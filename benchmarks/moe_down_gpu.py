"""Where the one-token MoE down projection's time goes: the up and down projections of the
Qwen3-30B-A3B shape alone, their weights cold (every call another 8 of the 128 experts, so
nothing is left in L2) or hot (the same 8 experts every call: the down projection's 25 MB stay
in L2), with and without programmatic dependent launch, and the pair in sequence. If the down
projection alone with hot weights is far under its cold time, it is bound by where its bytes
come from (the case for asking them into L2 earlier); if not, by its own programs' chains.

    python3 benchmarks/moe_down_gpu.py [--calls 32] [--rounds 2] [--study]
        [--variants 8x256x4,16x256x4,8x256x4e,p16x128x4]

Each figure is us a call: ``--calls`` launches captured in one CUDA graph, replayed 20 times.
"shipped" is the whole-row launch (``GEMV_ONE_TOKEN``'s 8 outputs over [8, 1024] tiles with
the rows prefetched before the wait: the one-token down projection before ``even_down``).
``--study``: those kernels hot and cold, with and without PDL and L2 hints. ``--variants``:
down projections of BLOCK_N outputs x BLOCK_K-column tiles x warps a program, the K loop
unrolled over whole tiles with no masks (``e``: the weights loaded before the wait, from the
expert id read before it; ``-N``: a -1 pair served as ``_down_variant``'s NEG says; a leading
``p`` / ``n``: the runner's own kernel, ``TILES``, with / without the prefetch), each alone
(hot, cold) and after the shipped up projection (cold), beside the shipped down projection;
same values (checked against it in the run). "uBNxBKxWARPS": up projections of the same form,
alone and before the ``--up-down`` launch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "moe" / "triton"))

from engine.api.moe import ExpertWeights  # noqa: E402
from engine.api.triton import launch_options, pdl_trigger, pdl_wait  # noqa: E402
from engine_moe_triton import kernels as mk  # noqa: E402
from engine_moe_triton.impl import GEMV_ONE_TOKEN  # noqa: E402

E, K, H, I = 128, 8, 2048, 768


def launches(ex: ExpertWeights, x, gate_up, down, ids, weights, which: str, hints: int):
    """One call: the up projection, the down projection, or both, at the one-token launch."""
    cfg = GEMV_ONE_TOKEN
    evict = "evict_first" if hints else ""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    opts = launch_options(x.device)
    if which in ("up", "both"):
        mk._pair_gemv_up[(pairs, triton.cdiv(2 * I, cfg["block_n"]))](
            x, ex.w13, gate_up, flat, 2 * I, H, x.stride(0), ex.w13.stride(0),
            ex.w13.stride(1), gate_up.stride(0), TOP_K=K, BLOCK_N=cfg["block_n"],
            BLOCK_K=min(cfg["block_k"], H), ACC2D=False, NEXT=False, EVICT=evict,
            num_warps=cfg["warps"], **opts)
    if which in ("down", "both"):
        mk._pair_gemv_down[(pairs, triton.cdiv(H, cfg["down_block_n"]))](
            gate_up, ex.w2, down, flat, weights.reshape(-1), H, I, gate_up.stride(0),
            ex.w2.stride(0), ex.w2.stride(1), down.stride(0), BLOCK_N=cfg["down_block_n"],
            BLOCK_K=min(cfg["down_block_k"], triton.next_power_of_2(I)), ACC2D=False,
            PREFETCH=True, NEXT=False, EVICT=evict, KEEP=hints >= 2,
            num_warps=cfg["down_warps"], **opts)


@triton.jit
def _down_variant(gu_ptr, w_ptr, out_ptr, ids_ptr, weights_ptr, stride_gu, stride_we,
                  stride_wn, stride_o, I: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, EVICT: tl.constexpr, EARLY: tl.constexpr,
                  PDL: tl.constexpr, NEG: tl.constexpr = 0):
    """The down projection of the shipped kernel's math (``weight * w2[e] @ (silu(g) * u)``,
    the activation rounded to the row's type) over whole [BLOCK_N, BLOCK_K] tiles of the I
    inputs, unrolled, no masks (N a multiple of BLOCK_N, I of BLOCK_K). EARLY: the tiles loaded
    before the wait with the expert id read before it (a timing experiment only). NEG, how a
    pair of another rank's expert (-1) would be served: 0 not at all; 1 a branch to zeros after
    the id's load; 2 the weights' loads masked off and the row zeroed; 3 expert 0's weights
    read and the row zeroed."""
    pdl_trigger(PDL)
    pair = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    TILES: tl.constexpr = I // BLOCK_K
    if EARLY:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
        w0 = tl.load(w_rows + tl.arange(0, BLOCK_K)[None, :], eviction_policy=EVICT)
        if TILES > 1:
            w1 = tl.load(w_rows + BLOCK_K + tl.arange(0, BLOCK_K)[None, :],
                         eviction_policy=EVICT)
        if TILES > 2:
            w2 = tl.load(w_rows + 2 * BLOCK_K + tl.arange(0, BLOCK_K)[None, :],
                         eviction_policy=EVICT)
    pdl_wait(PDL)
    if not EARLY:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        if NEG == 1:
            if expert < 0:
                tl.store(out_ptr + pair * stride_o + offs_n,
                         tl.zeros((BLOCK_N,), tl.float32).to(out_ptr.dtype.element_ty))
                return
        mine = expert >= 0
        owned = (tl.zeros((BLOCK_N, BLOCK_K), tl.int64) + expert) >= 0  # (as a block)
        e = tl.maximum(expert, 0) if NEG >= 2 else expert
        w_rows = w_ptr + e * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    gu_row = gu_ptr + pair * stride_gu
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for t in tl.static_range(TILES):
        offs_k = t * BLOCK_K + tl.arange(0, BLOCK_K)
        if EARLY and t == 0:
            w = w0
        elif EARLY and t == 1:
            w = w1
        elif EARLY and t == 2:
            w = w2
        elif NEG == 2:
            w = tl.load(w_rows + offs_k[None, :], mask=owned, other=0.0, eviction_policy=EVICT)
        else:
            w = tl.load(w_rows + offs_k[None, :], eviction_policy=EVICT)
        acc2 += w.to(tl.float32) * mk.silu_tile(gu_row, offs_k, I)[None, :]
    acc = tl.sum(acc2, axis=1) * tl.load(weights_ptr + pair)
    if NEG >= 2:
        acc = tl.where(mine, acc, 0.0)
    tl.store(out_ptr + pair * stride_o + offs_n, acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _up_variant(x_ptr, w_ptr, out_ptr, ids_ptr, stride_we, stride_wn, stride_o,
                K: tl.constexpr, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr):
    """The up projection of the shipped kernel's math over whole [BLOCK_N, BLOCK_K] tiles of
    the K inputs, unrolled, no masks, one sum at the end."""
    pdl_wait(PDL)
    pdl_trigger(PDL)
    pair = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // TOP_K) * K
    w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for t in tl.static_range(K // BLOCK_K):
        offs_k = t * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_rows + offs_k[None, :], eviction_policy=EVICT)
        x = tl.load(x_row + offs_k).to(tl.float32)
        acc2 += w.to(tl.float32) * x[None, :]
    tl.store(out_ptr + pair * stride_o + offs_n, tl.sum(acc2, axis=1).to(out_ptr.dtype.element_ty))


def up_variant(ex, x, gate_up, ids, spec: str):
    """The up projection of launch ``spec`` = "uBNxBKxWARPS"."""
    bn, bk, warps = (int(v) for v in spec[1:].split("x"))
    flat = ids.reshape(-1)
    _up_variant[(flat.numel(), 2 * I // bn)](
        x, ex.w13, gate_up, flat, ex.w13.stride(0), ex.w13.stride(1), gate_up.stride(0), K=H,
        TOP_K=K, BLOCK_N=bn, BLOCK_K=bk, EVICT="evict_first", num_warps=warps,
        **launch_options(x.device))


def down_variant(ex, gate_up, down, ids, weights, spec: str):
    """The down projection of launch ``spec`` = "BNxBKxWARPS[e]"; "pBNxBKxWARPS": the shipped
    kernel's whole-tile form (``TILES``) with its prefetch before the wait, "n" without."""
    if spec[0] in "pn":
        bn, bk, warps = (int(v) for v in spec[1:].split("x"))
        flat = ids.reshape(-1)
        mk._pair_gemv_down[(flat.numel(), H // bn)](
            gate_up, ex.w2, down, flat, weights.reshape(-1), H, I, gate_up.stride(0),
            ex.w2.stride(0), ex.w2.stride(1), down.stride(0), BLOCK_N=bn, BLOCK_K=bk,
            ACC2D=False, PREFETCH=spec[0] == "p", NEXT=False, EVICT="evict_first", KEEP=False,
            num_warps=warps, TILES=I // bk, **launch_options(gate_up.device))
        return
    neg = 0
    if spec[-2:-1] == "-":  # "...-N": a -1 pair served as NEG N says
        spec, neg = spec[:-2], int(spec[-1])
    early = spec.endswith("e")
    bn, bk, warps = (int(v) for v in spec.rstrip("e").split("x"))
    flat = ids.reshape(-1)
    _down_variant[(flat.numel(), H // bn)](
        gate_up, ex.w2, down, flat, weights.reshape(-1), gate_up.stride(0), ex.w2.stride(0),
        ex.w2.stride(1), down.stride(0), I=I, BLOCK_N=bn, BLOCK_K=bk, EVICT="evict_first",
        EARLY=early and bk * 3 >= I, NEG=neg, num_warps=warps,
        **launch_options(gate_up.device))


def time_calls(fn, calls: int) -> float:
    """us a call of ``fn(i)`` for i in range(calls), captured in one graph."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(0)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (20 * calls)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--study", action="store_true")
    ap.add_argument("--variants", default="")
    ap.add_argument("--up-down", default="p16x128x4",
                    help="the down launch timed after each up launch (uBNxBKxWARPS variants)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    ex = ExpertWeights(E, H, I, torch.bfloat16).cuda()
    ex.w13.data.normal_(0, 0.02, generator=g)
    ex.w2.data.normal_(0, 0.02, generator=g)
    sets = torch.randperm(E, device=dev, generator=g).view(E // K, 1, K).to(torch.int32)
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    weights = torch.full((1, K), 1.0 / K, device=dev, dtype=torch.float32)
    gate_up = torch.empty(K, 2 * I, device=dev, dtype=torch.bfloat16)
    down = torch.empty(K, H, device=dev, dtype=torch.bfloat16)
    name = torch.cuda.get_device_name(dev)
    up_mb, down_mb = K * 2 * I * H * 2 / 1e6, K * H * I * 2 / 1e6
    print(f"{name}; one token, 8 of 128 experts: up {up_mb:.1f} MB, down {down_mb:.1f} MB")
    # (the values: the same arithmetic as the runner kit checks; here only the time)
    if args.variants:
        variants(args, ex, sets, x, weights, gate_up, down)
    if not args.study:
        return
    rows = []
    for r in range(args.rounds):
        for pdl in ("1", "0"):
            os.environ["ENGINE_PDL"] = pdl
            for hints in (1, 0):
                for which in ("up", "down", "both"):
                    for temp in ("cold", "hot"):
                        def fn(i, which=which, temp=temp, hints=hints):
                            ids = sets[i % sets.shape[0]] if temp == "cold" else sets[0]
                            launches(ex, x, gate_up, down, ids, weights, which, hints)
                        us = time_calls(fn, args.calls)
                        mb = {"up": up_mb, "down": down_mb, "both": up_mb + down_mb}[which]
                        rows.append((r + 1, pdl, hints, which, temp, us, mb / us))
    os.environ.pop("ENGINE_PDL", None)
    print("| round | PDL | L2 hints | kernel | weights | us a call | TB/s |")
    print("|---|---|---|---|---|---|---|")
    for r, pdl, hints, which, temp, us, tbs in rows:
        print(f"| {r} | {pdl} | {hints} | {which} | {temp} | {us:.2f} | {tbs:.2f} |")


def variants(args, ex, sets, x, weights, gate_up, down) -> None:
    """Each down launch alone (hot, cold) and after the shipped up projection (cold), the
    shipped one first, ``--rounds`` times in turn; values checked against the shipped one."""
    specs = ["shipped"] + [v for v in args.variants.split(",") if v[0] != "u"]
    ups = [v for v in args.variants.split(",") if v[0] == "u"]
    launches(ex, x, gate_up, down, sets[0], weights, "both", 1)
    want_gu = gate_up.float().clone()
    want = down.float().clone()
    for spec in ups:
        gate_up.zero_()
        up_variant(ex, x, gate_up, sets[0], spec)
        err = (gate_up.float() - want_gu).abs().max().item()
        print(f"{spec}: max |difference| from the shipped up projection {err:.3e} "
              f"(largest output {want_gu.abs().max().item():.3e})")
    launches(ex, x, gate_up, down, sets[0], weights, "up", 1)
    for spec in specs[1:]:
        down.zero_()
        down_variant(ex, gate_up, down, sets[0], weights, spec)
        err = (down.float() - want).abs().max().item()
        print(f"{spec}: max |difference| from the shipped down projection {err:.3e} "
              f"(largest output {want.abs().max().item():.3e})")
    res: dict[str, list] = {s: [] for s in specs}
    for _ in range(args.rounds):
        for spec in specs:
            def down_fn(i, temp, spec=spec):
                ids = sets[i % sets.shape[0]] if temp == "cold" else sets[0]
                if spec == "shipped":
                    launches(ex, x, gate_up, down, ids, weights, "down", 1)
                else:
                    down_variant(ex, gate_up, down, ids, weights, spec)

            def both_fn(i, spec=spec):
                ids = sets[i % sets.shape[0]]
                launches(ex, x, gate_up, down, ids, weights, "up", 1)
                down_fn(i, "cold")
            res[spec].append((time_calls(lambda i: down_fn(i, "hot"), args.calls),
                              time_calls(lambda i: down_fn(i, "cold"), args.calls),
                              time_calls(both_fn, args.calls)))
    print("| down launch (BLOCK_N x BLOCK_K x warps) | down hot, us | down cold, us | "
          "up + down cold, us |")
    print("|---|---|---|---|")
    for spec in specs:
        cols = [" / ".join(f"{t[j]:.2f}" for t in res[spec]) for j in range(3)]
        print(f"| {spec} | " + " | ".join(cols) + " |")
    if not ups:
        return
    down_spec = args.up_down
    up_res: dict[str, list] = {s: [] for s in ["shipped"] + ups}
    for _ in range(args.rounds):
        for spec in up_res:
            def up_fn(i, spec=spec):
                ids = sets[i % sets.shape[0]]
                if spec == "shipped":
                    launches(ex, x, gate_up, down, ids, weights, "up", 1)
                else:
                    up_variant(ex, x, gate_up, ids, spec)

            def pair_fn(i, up_fn=up_fn):
                up_fn(i)
                down_variant(ex, gate_up, down, sets[i % sets.shape[0]], weights, down_spec)
            up_res[spec].append((time_calls(up_fn, args.calls),
                                 time_calls(pair_fn, args.calls)))
    print(f"| up launch (BLOCK_N x BLOCK_K x warps) | up cold, us | up + {down_spec} cold, us |")
    print("|---|---|---|")
    for spec, t in up_res.items():
        cols = [" / ".join(f"{v[j]:.2f}" for v in t) for j in range(2)]
        print(f"| {spec} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
