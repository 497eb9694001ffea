"""The core's CPU attention kernel read straight from the pool (``fused_cpu.decode_attention``,
what torch_native runs on the CPU for float32 / 16-bit pools), at the default model's shape (9
query heads on 3 KV heads of 64) over scattered slots: an extend of T tokens (token t sees t + 1
keys, as a prefill) and one decode token over a long context. Prints a markdown table, the best
of ``--rounds`` timings each.

    python benchmarks/attention_cpu.py [--tokens 1000] [--context 1000,4000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.runtime import fused_cpu


def best(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1000, help="extend tokens (a prefill)")
    ap.add_argument("--context", default="1000,4000", help="decode context lengths")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heads", default="9,3,64", help="query heads, KV heads, head dim")
    args = ap.parse_args()
    hq, hk, d = (int(x) for x in args.heads.split(","))
    contexts = [int(c) for c in args.context.split(",") if c]
    longest = max([args.tokens, *contexts])
    slots = 2 * longest + 1
    gen = torch.Generator().manual_seed(0)
    kp, vp = torch.randn(slots, hk, d, generator=gen), torch.randn(slots, hk, d, generator=gen)
    table = (torch.randperm(slots - 1, generator=gen)[:longest] + 1)[None, :].contiguous()
    q = torch.randn(max(args.tokens, 1), hq, d, generator=gen)
    print(f"| pool dtype | extend {args.tokens} tokens (ms) | "
          + " | ".join(f"decode, {c} keys (us)" for c in contexts) + " |")
    print("|---|---|" + "---|" * len(contexts))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        k, v = kp.to(dtype), vp.to(dtype)
        t = args.tokens
        rows = torch.zeros(t, dtype=torch.int64)
        lens = torch.arange(1, t + 1)
        ext = best(lambda: fused_cpu.decode_attention(q[:t], k, v, table, rows, lens, t,
                                                      d ** -0.5), args.rounds)
        dec = []
        for c in contexts:
            lc = torch.tensor([c])
            dec.append(best(lambda lc=lc, c=c: fused_cpu.decode_attention(
                q[:1], k, v, table, rows[:1], lc, c, d ** -0.5), args.rounds * 4))
        print(f"| {str(dtype).removeprefix('torch.')} | {ext * 1e3:.1f} | "
              + " | ".join(f"{x * 1e6:.0f}" for x in dec) + " |", flush=True)


if __name__ == "__main__":
    main()
