"""Loading a hit back from the host tier on the CPU: ``--hicache-io-backend kernel`` (one index
copy per layer and side) against ``direct`` (one copy per run of pages that follow each other on
both sides, layer and side), for the default model's KV geometry (30 layers, 3 KV heads of 64,
float32, pages of 16), a 2,000-token hit whose pages come in runs of 1, 8 (what the free lists
give after churn) or all 125. Prints the median of ``--rounds`` loads per case, each load
settled (every layer copied).

    python benchmarks/hicache_io_cpu.py [--rounds 9] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from engine.runtime.attention import KVPool
from engine.runtime.host_pool import HostKVPool, Transfer

PAGE, LAYERS, HEADS, DIM, PAGES = 16, 30, 3, 64, 125


def run_slots(rng: random.Random, total_pages: int, run: int) -> torch.Tensor:
    """The slots of PAGES pages in runs of ``run`` consecutive pages, the runs scattered."""
    starts = rng.sample(range(1, total_pages // run - 1), PAGES // run)
    pages = [p for s in starts for p in range(s * run, s * run + run)]
    return (torch.tensor(pages)[:, None] * PAGE + torch.arange(PAGE)).reshape(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = KVPool(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, num_slots=16384,
                 page_size=PAGE, dtype=torch.float32, device=torch.device("cpu"))
    host = HostKVPool(dev, 32768)
    rng = random.Random(0)
    print(f"| pages a run | kernel ms | direct ms | direct / kernel |  ({PAGES * PAGE} tokens, "
          f"{LAYERS} layers, median of {args.rounds})")
    print("|---|---|---|---|")
    for run in (1, 8, PAGES):
        d, h = run_slots(rng, 16384 // PAGE, run), run_slots(rng, 32768 // PAGE, run)
        times: dict[str, list[float]] = {"kernel": [], "direct": []}
        transfers = {io: Transfer(dev, host, io) for io in times}
        for _ in range(args.rounds):  # alternating, so drift hits both alike
            for io, t in transfers.items():
                t0 = time.perf_counter()
                t.to_device(h, d)
                dev.settle_loads()
                times[io].append(time.perf_counter() - t0)
        k, r = (statistics.median(times[io]) * 1e3 for io in ("kernel", "direct"))
        print(f"| {run} | {k:.1f} | {r:.1f} | {r / k:.2f}x |")


if __name__ == "__main__":
    main()
