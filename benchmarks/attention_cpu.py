"""The core's CPU attention kernel read straight from the pool (``fused_cpu.decode_attention``,
what torch_native runs on the CPU for float32 / 16-bit pools), at the default model's shape (9
query heads on 3 KV heads of 64) over scattered slots: an extend of T tokens (token t sees t + 1
keys, as a prefill) and ``--batch`` decode tokens over a long context (through ``--layers``
pools in turn, as a model's step does). Prints a markdown table,
the best of ``--rounds`` timings each (a decode timing: the median of 20 calls in a row).
``--against FILE`` builds another version of ``fused_cpu.c`` (an earlier revision: ``git show
REV:core/engine/runtime/fused_cpu.c > FILE``) and times the two alternately in the same
process, a row each.

    python benchmarks/attention_cpu.py [--tokens 1000] [--context 1000,4000] [--rounds 5]
        [--batch 1] [--dtypes float32,float16,bfloat16] [--layers 1] [--against FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.runtime import fused_cpu


def timings(fn, calls: int) -> list[float]:
    """Seconds of ``calls`` back-to-back calls after a first one (its data then in cache, as a
    decode step's layers find their pool rows when the context fits the caches)."""
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1000, help="extend tokens (a prefill)")
    ap.add_argument("--context", default="1000,4000", help="decode context lengths")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heads", default="9,3,64", help="query heads, KV heads, head dim")
    ap.add_argument("--batch", type=int, default=1, help="decode requests (same context)")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--against", default=None, help="another fused_cpu.c to time alongside")
    ap.add_argument("--layers", type=int, default=1,
                    help="decode through this many pools in turn (a model's layers: from 30, "
                         "their rows no longer all in cache), us per layer")
    args = ap.parse_args()
    builds = {"this": fused_cpu._library()}
    if args.against:
        fused_cpu._library.cache_clear()
        shipped, fused_cpu._SOURCE = fused_cpu._SOURCE, args.against
        builds[args.against] = fused_cpu._library()
        fused_cpu._SOURCE = shipped
    hq, hk, d = (int(x) for x in args.heads.split(","))
    contexts = [int(c) for c in args.context.split(",") if c]
    longest = max([args.tokens, *contexts])
    slots = 2 * longest + 1
    gen = torch.Generator().manual_seed(0)
    kp, vp = torch.randn(slots, hk, d, generator=gen), torch.randn(slots, hk, d, generator=gen)
    table = (torch.randperm(slots - 1, generator=gen)[:longest] + 1)[None, :].contiguous()
    q = torch.randn(max(args.tokens, args.batch, 1), hq, d, generator=gen)
    head = "| pool dtype | " + ("build | " if args.against else "")
    print(head + f"extend {args.tokens} tokens (ms) | "
          + " | ".join(f"decode x{args.batch}, {c} keys (us)" for c in contexts) + " |")
    print("|---|---|" + "---|" * (len(contexts) + bool(args.against)))
    n = args.batch
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        k, v = kp.to(dtype), vp.to(dtype)
        pools = [(k, v)] + [(torch.randn_like(kp).to(dtype), torch.randn_like(vp).to(dtype))
                            for _ in range(args.layers - 1)]
        t = args.tokens
        rows = torch.zeros(max(t, n), dtype=torch.int64)
        lens = torch.arange(1, t + 1)
        times: dict[str, list[float]] = {b: [] for b in builds}
        for _ in range(args.rounds):  # the builds alternate, each timing the best of a few
            for b, lib in builds.items():
                fused_cpu._library = lambda lib=lib: lib
                ext = min(timings(lambda: fused_cpu.decode_attention(
                    q[:t], k, v, table, rows[:t], lens, t, d ** -0.5), 1))
                dec = []
                for c in contexts:
                    lc = torch.full((n,), c)

                    def step(lc=lc, c=c):  # every pool (layer) in turn
                        for kl, vl in pools:
                            fused_cpu.decode_attention(q[:n], kl, vl, table, rows[:n], lc, c,
                                                       d ** -0.5)

                    dec.append(statistics.median(timings(step, 20)) / len(pools))
                times[b].append([ext, *dec])
        for b, rounds in times.items():
            cols = [min(r[i] for r in rounds) for i in range(len(contexts) + 1)]
            print(f"| {name} | " + (f"{b} | " if args.against else "") + f"{cols[0] * 1e3:.1f} | "
                  + " | ".join(f"{x * 1e6:.0f}" for x in cols[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
