"""Online serving benchmark over HTTP, shaped like SGLang's ``bench_serving`` random dataset:
prints a table (one row per concurrency level) and writes JSON to ``$OUT`` when set.

Requests are streamed ``/generate`` calls with token ids (so any server works, including one
started with ``--skip-tokenizer-init``): prompt ids drawn uniformly from the vocabulary, input
and output lengths drawn uniformly from ``[range_ratio * len, len]`` (SGLang's rule), greedy,
``ignore_eos`` so each request makes exactly its output length. At each concurrency level
``--num-prompts`` requests (default: 4x the level, at least 16) are sent as fast as the level
allows (request rate unlimited), from one client process per 32 concurrent streams (one Python
process parsing hundreds of streams saturates its core before the server does); figures per
level:

* output tok/s and input tok/s: tokens over the level's wall time;
* TTFT p50/p99: request sent -> first output token; "after the burst": p50 of the requests
  sent once the opening burst was in (each as an earlier one finished);
* inter-token p50/p99: gaps between streamed chunks, each gap shared by the tokens of its chunk;
* TPOT mean: (latency - TTFT) / (output tokens - 1) per request, averaged.

    python3 benchmarks/bench_serving.py [--url http://host:port] [--concurrency 1,16,64,256]
        [--input-len 1024] [--output-len 256] [--range-ratio 0.5] [--num-prompts N]
        [--vocab V] [--client-procs P] [--label NAME] [-- engine serve flags]

Without ``--url`` the script starts ``python3 -m engine.cli.main serve <flags>`` itself (and
prints its start -> ready seconds); ``--vocab`` defaults to the served model's vocabulary size
(from ``/v1/models`` when the server reports it, else 32000).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _server import free_port, stop, wait_ready  # noqa: E402


#: concurrent streams one client process handles (beyond it, another process is used)
CLIENT_STREAMS = 32


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def one(client: httpx.AsyncClient, ids: list[int], out_len: int) -> dict:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": out_len, "temperature": 0.0,
                                "ignore_eos": True}}
    t0 = time.perf_counter()
    last, seen, ttft, gaps = t0, 0, None, []
    async with client.stream("POST", "/generate", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            n = len(json.loads(line[6:]).get("output_ids") or ())
            if n <= seen:
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
                if n - seen > 1:
                    gaps += [0.0] * (n - seen - 1)
            else:
                gaps += [(now - last) / (n - seen)] * (n - seen)
            last, seen = now, n
    return {"ttft": ttft or 0.0, "latency": last - t0, "out": seen, "in": len(ids),
            "gaps": gaps}


async def _group(url: str, requests: list[tuple[list[int], int]],
                 concurrency: int) -> tuple[list[dict], float, float]:
    limits = httpx.Limits(max_connections=concurrency + 8,
                          max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        sem = asyncio.Semaphore(concurrency)

        async def run(item):
            async with sem:
                return await one(client, *item)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(run(item) for item in requests))
        return results, t0, time.perf_counter()


def _run_group(url: str, requests: list[tuple[list[int], int]], concurrency: int,
               start_at: float) -> tuple[list[dict], float, float]:
    """One client process's share of a level, started at the shared ``start_at``."""
    time.sleep(max(0.0, start_at - time.perf_counter()))
    return asyncio.run(_group(url, requests, concurrency))


def level(url: str, requests: list[tuple[list[int], int]], concurrency: int,
          procs: int) -> dict:
    """Send ``requests`` at ``concurrency`` from ``procs`` client processes (each with its
    share of the concurrency and of the requests, round-robin): one Python client streaming
    hundreds of responses saturates its core before the server does."""
    procs = max(1, min(procs, concurrency))
    shares = [concurrency // procs + (1 if k < concurrency % procs else 0) for k in range(procs)]
    groups = [requests[k::procs] for k in range(procs)]
    if procs == 1:
        parts = [asyncio.run(_group(url, requests, concurrency))]
    else:
        ctx = multiprocessing.get_context("fork")
        start_at = time.perf_counter() + 1.0
        with concurrent.futures.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
            parts = list(pool.map(_run_group, [url] * procs, groups, shares,
                                  [start_at] * procs))
    wall = max(p[2] for p in parts) - min(p[1] for p in parts)
    results = [r for p in parts for r in p[0]]
    # the requests each process sent after its opening burst (each as an earlier one finished)
    later = [r for p, share in zip(parts, shares) for r in p[0][share:]]
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    gaps = [g for r in ok for g in r["gaps"]]
    tpot = [(r["latency"] - r["ttft"]) / (r["out"] - 1) for r in ok if r["out"] > 1]
    return {
        "concurrency": concurrency, "requests": len(requests), "completed": len(ok),
        "client_procs": procs, "errors": errors[:3], "wall_s": wall,
        "output_tok_s": sum(r["out"] for r in ok) / wall,
        "input_tok_s": sum(r["in"] for r in ok) / wall,
        "ttft_p50_ms": 1000 * pct([r["ttft"] for r in ok], 0.5),
        "ttft_p99_ms": 1000 * pct([r["ttft"] for r in ok], 0.99),
        "ttft_later_p50_ms": 1000 * pct([r["ttft"] for r in later if "error" not in r], 0.5),
        "itl_p50_ms": 1000 * pct(gaps, 0.5), "itl_p99_ms": 1000 * pct(gaps, 0.99),
        "tpot_mean_ms": 1000 * statistics.fmean(tpot) if tpot else float("nan"),
    }


def kernel_builds(url: str) -> dict[str, float]:
    """The server's Triton kernel builds, all and after ready, from ``/metrics`` (empty where
    it does not say): a build after ready is a stall some request waited for."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        name = name.split("{")[0]
        if name in ("engine_kernel_builds", "engine_kernel_builds_after_ready"):
            out[name] = float(value)
    return out


def draw(rng: random.Random, n: int, args, vocab: int) -> list[tuple[list[int], int]]:
    out = []
    for _ in range(n):
        li = rng.randint(max(1, int(args.input_len * args.range_ratio)), args.input_len)
        lo = rng.randint(max(1, int(args.output_len * args.range_ratio)), args.output_len)
        out.append(([rng.randrange(vocab) for _ in range(li)], lo))
    return out


def main() -> int:
    argv = sys.argv[1:]
    serve_flags: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, serve_flags = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url")
    p.add_argument("--concurrency", default="1,16,64,256")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--range-ratio", type=float, default=0.5)
    p.add_argument("--num-prompts", type=int, default=0)
    p.add_argument("--vocab", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="")
    p.add_argument("--warmup", type=int, default=2, help="requests sent before measuring")
    p.add_argument("--client-procs", type=int, default=0,
                   help=f"client processes (default: one per {CLIENT_STREAMS} concurrent streams)")
    args = p.parse_args(argv)

    proc, startup, log_path = None, None, None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = os.path.join(tempfile.mkdtemp(prefix="bench-serving-"), "server.log")
        t0 = time.perf_counter()
        # BENCH_SERVER_PREFIX: a command the server runs under (a profiler), split on spaces
        prefix = os.environ.get("BENCH_SERVER_PREFIX", "").split()
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "engine.cli.main", "serve",
                                 *serve_flags,
                                 "--port", str(port)], stdout=open(log_path, "w"),
                                stderr=subprocess.STDOUT)
        if not wait_ready(proc, url, log_path, poll_s=0.1):
            return 1
        startup = time.perf_counter() - t0
    try:
        vocab = args.vocab
        if not vocab:
            try:
                info = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
                vocab = int(info.get("vocab_size") or 32000)
            except (httpx.HTTPError, KeyError, ValueError, IndexError):
                vocab = 32000
        rng = random.Random(args.seed)
        level(url, draw(rng, args.warmup, args, vocab), max(1, args.warmup), 1)
        rows = []
        for c in [int(x) for x in args.concurrency.split(",") if x]:
            n = args.num_prompts or max(16, 4 * c)
            procs = args.client_procs or -(-c // CLIENT_STREAMS)
            rows.append(level(url, draw(rng, n, args, vocab), c, procs))
            r = rows[-1]
            print(f"concurrency {c}: {r['completed']}/{r['requests']} in {r['wall_s']:.1f} s, "
                  f"{r['output_tok_s']:.0f} out tok/s" + (f", errors {r['errors']}"
                                                          if r["errors"] else ""), flush=True)
        builds = kernel_builds(url)
    finally:
        if proc is not None:
            stop(proc)
            if os.environ.get("OUT") and log_path:  # the server's log, next to the JSON
                tag = "".join(ch if ch.isalnum() else "_" for ch in args.label)[:60]
                shutil.copy(log_path, os.path.join(os.environ["OUT"], f"server-{tag}.log"))
    label = args.label or " ".join(serve_flags) or url
    print(f"\n{label}: random ids (vocab {vocab}), input {args.input_len} / output "
          f"{args.output_len} tokens, range ratio {args.range_ratio}, request rate unlimited"
          + (f"; start -> ready {startup:.1f} s" if startup is not None else "")
          + "".join(f"; {k} {v:g}" for k, v in builds.items()))
    print("| concurrency | requests | output tok/s | input tok/s | TTFT p50 ms | TTFT p99 ms | "
          "TTFT p50 after the burst | inter-token p50 ms | inter-token p99 ms | TPOT mean ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['completed']}/{r['requests']} | {r['output_tok_s']:.0f} "
              f"| {r['input_tok_s']:.0f} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
              f"{r['ttft_later_p50_ms']:.1f} | "
              f"{r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | {r['tpot_mean_ms']:.2f} |")
    out_dir = os.environ.get("OUT")
    if out_dir:
        name = "bench_serving" + ("-" + "".join(ch if ch.isalnum() else "_" for ch in label)[:60]
                                  if label else "")
        with open(os.path.join(out_dir, name + ".json"), "w") as fh:
            json.dump({"label": label, "startup_s": startup, "vocab": vocab, **builds,
                       "args": vars(args), "rows": rows}, fh, indent=1)
    return 0 if all(r["completed"] == r["requests"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
