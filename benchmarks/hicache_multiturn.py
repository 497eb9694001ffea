"""Multi-turn benchmark of the hierarchical KV cache through a real ``engine serve``.

``--conversations`` conversations of ``--turns`` turns each; a turn sends the conversation so
far (every earlier prompt and answer) plus ``--user-tokens`` new token ids, and streams
``--output-tokens`` tokens back (greedy, ``ignore_eos``). ``--concurrency`` clients each take
the next turn of the conversation that has waited longest, so a conversation's next turn comes
after the others' and its prefix has left a device pool smaller than the working set.

Each configuration is a list of ``engine serve`` flags after ``--``, separated by ``--vs``
(leading ``NAME=value`` words set the server's environment: ``-- ENGINE_X=0 --page-size 64 --vs
ENGINE_X=1 --page-size 64`` compares a switch); the same workload (seeded token ids) runs
against each, one server at a time, and one table row is printed per configuration: TTFT
p50/p99 over all turns and over the later turns (hits), output throughput, and the share of
prompt tokens served from each tier (device, host, storage).

``--time-stats`` starts every server with ``--enable-request-time-stats-logging`` and adds a
table of where the later turns' TTFT went (queue, prefill, hand-over, the server's TTFT, and
the HTTP path: the client's TTFT less the server's), joined by request id.

Runs of one configuration on a GPU differ by a third from one server to the next, so
``--rounds N`` runs the list N times, each round starting one configuration later, and the
table gives each configuration's median over the rounds with every round's later-turn p50 and
its ratio to the first configuration's in the same round.

CPU, default model (the numbers of docs/benchmarks/hicache.md)::

    python benchmarks/hicache_multiturn.py --conversations 8 --turns 8 --user-tokens 64 \\
        --output-tokens 8 --concurrency 1 -- --device cpu --page-size 16 \\
        --max-total-tokens 1024 --vs --device cpu --page-size 16 --max-total-tokens 1024 \\
        --enable-hierarchical-cache --hicache-ratio 8

A GPU (dummy 8B weights), a long first turn (a document) and short turns after it, one
client (docs/benchmarks/hicache.md)::

    M="--model-path tests/data/llama3-8b-dummy --load-format dummy --dtype bfloat16 \\
       --skip-tokenizer-init --page-size 64 --max-total-tokens 32768"
    python benchmarks/hicache_multiturn.py --conversations 16 --turns 8 \\
        --first-user-tokens 2048 --user-tokens 128 --output-tokens 32 --concurrency 1 \\
        --vocab 128256 --rounds 3 --time-stats -- $M --vs $M --enable-hierarchical-cache \\
        --hicache-ratio 4

Several clients::

    python benchmarks/hicache_multiturn.py --user-tokens 512 --output-tokens 64 \\
        --concurrency 8 -- --model-path tests/data/llama3-8b-dummy --load-format dummy \\
        --dtype bfloat16 --skip-tokenizer-init --page-size 64 --max-total-tokens 65536 \\
        --vs --model-path tests/data/llama3-8b-dummy --load-format dummy --dtype bfloat16 \\
        --skip-tokenizer-init --page-size 64 --max-total-tokens 65536 \\
        --enable-hierarchical-cache --hicache-ratio 4
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Iterator

import httpx
# this folder, on the path when run as a script
from _server import free_port, stop, stream_events, wait_ready


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def stream_turn(client: Any, ids: list[int], n: int, rid: str
                ) -> tuple[float, list[int], dict]:
    """One streamed turn: (seconds to the first token, output ids, final meta_info);
    ``client`` an ``http.client.HTTPConnection`` or an ``httpx.Client``."""
    body = {"input_ids": ids, "stream": True, "rid": rid, "sampling_params": {
        "temperature": 0, "max_new_tokens": n, "ignore_eos": True}}
    t0 = time.perf_counter()
    ttft, out, meta = None, [], {}
    for item in (stream_events(client, "/generate", body)
                 if isinstance(client, http.client.HTTPConnection)
                 else _httpx_events(client, body)):
        if ttft is None and item.get("output_ids"):
            ttft = time.perf_counter() - t0
        out, meta = item.get("output_ids", out), item.get("meta_info", meta)
    return ttft if ttft is not None else time.perf_counter() - t0, out, meta


def _httpx_events(client: httpx.Client, body: dict) -> Iterator[dict]:
    with client.stream("POST", "/generate", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def run_workload(url: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    vocab = args.vocab
    convs = [[] for _ in range(args.conversations)]
    turns_done = [0] * args.conversations
    first = args.first_user_tokens or args.user_tokens
    user = [[[rng.randrange(100, vocab) for _ in range(first if t == 0 else args.user_tokens)]
             for t in range(args.turns)] for _ in range(args.conversations)]
    lock = threading.Lock()
    order = list(range(args.conversations)) * args.turns  # round robin: turn t of all, t + 1
    records: list[dict[str, Any]] = []
    busy: set[int] = set()

    def take() -> int | None:
        with lock:
            for k, c in enumerate(order):
                if c not in busy:
                    busy.add(c)
                    return order.pop(k)
            return None

    def connect() -> Any:
        if args.client == "httpx":
            return httpx.Client(base_url=url, timeout=600)
        host, _, port = url.split("://", 1)[-1].rstrip("/").partition(":")
        return contextlib.closing(http.client.HTTPConnection(host, int(port or 80),
                                                             timeout=600))

    def worker() -> None:
        with connect() as client:
            while True:
                c = take()
                if c is None:
                    with lock:
                        if not order:
                            return
                    time.sleep(0.01)
                    continue
                t = turns_done[c]
                ids = convs[c] + user[c][t]
                rid = f"c{c}-t{t}-{uuid.uuid4().hex[:8]}"
                ttft, out, meta = stream_turn(client, ids, args.output_tokens, rid)
                with lock:
                    convs[c] = ids + out
                    turns_done[c] += 1
                    busy.discard(c)
                    records.append({"rid": rid, "turn": t, "ttft": ttft, "prompt": len(ids),
                                    "out": len(out), "cached": meta.get("cached_tokens", 0),
                                    "tiers": meta.get("cached_tokens_details") or {}})

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    prompt = sum(r["prompt"] for r in records)
    tiers = {k: sum(r["tiers"].get(k, 0) for r in records) / prompt
             for k in ("device", "host", "storage")}
    if not any(r["tiers"] for r in records):
        tiers["device"] = sum(r["cached"] for r in records) / prompt
    later = [r["ttft"] for r in records if r["turn"] > 0]
    return {"requests": len(records), "wall_s": wall,
            "ttft_p50_ms": pct([r["ttft"] for r in records], 50) * 1e3,
            "ttft_p99_ms": pct([r["ttft"] for r in records], 99) * 1e3,
            "ttft_later_p50_ms": pct(later, 50) * 1e3, "ttft_later_p99_ms": pct(later, 99) * 1e3,
            "output_tok_s": sum(r["out"] for r in records) / wall,
            "prompt_tok_s": prompt / wall, "hit": tiers,
            "mean_prompt_tokens": prompt / len(records), "records": records}


#: the phases of ``--enable-request-time-stats-logging`` (ms), as the table shows them
PHASES = ("queue", "prefill", "handover", "ttft")


def later_phases(records: list[dict[str, Any]], log_path: str) -> dict[str, float]:
    """The server's time stats of the later turns (their medians, ms), joined to the client's
    records by request id; ``http`` is the client's TTFT less the server's (the HTTP path:
    request parsing, the stream's first event, the client)."""
    stats: dict[str, dict[str, Any]] = {}
    with open(log_path, errors="replace") as fh:
        for line in fh:
            if '"queue"' in line and "{" in line:
                try:
                    item = json.loads(line[line.index("{"):])
                except ValueError:
                    continue
                stats[item.get("rid", "")] = item
    rows = [(r, stats[r["rid"]]) for r in records if r["turn"] > 0 and r["rid"] in stats]
    if not rows:
        return {}
    out = {k: statistics.median(s[k] for _, s in rows if s.get(k) is not None)
           for k in PHASES}
    out["http"] = statistics.median(r["ttft"] * 1e3 - s["ttft"] for r, s in rows
                                    if s.get("ttft") is not None)
    out["client ttft"] = statistics.median(r["ttft"] * 1e3 for r, _ in rows)
    return out


def split_env(flags: list[str]) -> tuple[dict[str, str], list[str]]:
    """A configuration's leading ``NAME=value`` words (the server's environment) and flags."""
    env: dict[str, str] = {}
    i = 0
    while i < len(flags) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", flags[i]):
        name, _, value = flags[i].partition("=")
        env[name] = value
        i += 1
    return env, flags[i:]


def serve_and_run(config: list[str], args: argparse.Namespace) -> dict[str, Any]:
    env, flags = split_env(config)
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="engine-hicache-bench-", suffix=".log",
                                      delete=False)
    if args.time_stats:
        flags = [*flags, "--enable-request-time-stats-logging", "--log-requests-format", "json"]
    cmd = [sys.executable, "-m", "engine.cli.main", "serve", "--host", "127.0.0.1", "--port",
           str(port), "--max-running-requests", str(max(args.concurrency, 1)), *flags]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONWARNINGS="ignore", **env))
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(proc, url, log.name):
            raise SystemExit(f"server failed: {' '.join(flags)}")
        res = run_workload(url, args)
        if args.time_stats:
            log.flush()
            res["phases"] = later_phases(res["records"], log.name)
        return res
    finally:
        stop(proc, timeout=60)
        if args.server_logs:  # kept, one file a server started
            os.makedirs(args.server_logs, exist_ok=True)
            n = len(os.listdir(args.server_logs))
            shutil.move(log.name, os.path.join(args.server_logs, f"server-{n}.log"))
        else:
            os.unlink(log.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--user-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--first-user-tokens", type=int, default=0,
                    help="tokens of each conversation's first turn (a long document or system "
                         "prompt; default: --user-tokens)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", help="measure this running server instead (no flags after --)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--server-logs", metavar="DIR",
                    help="keep each server's log in DIR (server-N.log, in the order started)")
    ap.add_argument("--client", choices=("http.client", "httpx"), default="http.client",
                    help="the HTTP client (the standard library's costs less time per "
                    "request, which would count as TTFT)")
    ap.add_argument("--time-stats", action="store_true",
                    help="start the servers with --enable-request-time-stats-logging and show "
                    "where the later turns' TTFT went (queue, prefill, hand-over, HTTP)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every configuration this many times, the order rotated each round")
    argv = sys.argv[1:]
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    args = ap.parse_args(argv)
    configs: list[list[str]] = [[]]
    for tok in rest:
        if tok == "--vs":
            configs.append([])
        else:
            configs[-1].append(tok)
    if args.url:
        configs = [[]]
    rounds: list[list[dict[str, Any]]] = []  # [round][configuration]
    for r in range(max(1, args.rounds)):
        got: dict[int, dict[str, Any]] = {}
        for k in range(len(configs)):
            c = (r + k) % len(configs)
            res = run_workload(args.url, args) if args.url else serve_and_run(configs[c], args)
            res["flags"], res["round"] = " ".join(configs[c]) or args.url or "(defaults)", r
            res.pop("records")
            got[c] = res
            print(json.dumps(res), file=sys.stderr)
        rounds.append([got[c] for c in range(len(configs))])
    results = [median_result([rnd[c] for rnd in rounds]) for c in range(len(configs))]
    print(f"\n{args.conversations} conversations x {args.turns} turns, first turn "
          f"{args.first_user_tokens or args.user_tokens} tokens, +{args.user_tokens} "
          f"user tokens and {args.output_tokens} output tokens a turn, {args.concurrency} "
          f"clients{f', median of {len(rounds)} rounds' if len(rounds) > 1 else ''}\n")
    print("| configuration | TTFT p50 / p99 (ms) | later turns TTFT p50 / p99 (ms) | "
          "output tok/s | hit device / host / storage |")
    print("|---|---|---|---|---|")
    for r in results:
        h = r["hit"]
        print(f"| `{r['flags']}` | {r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
              f"{r['ttft_later_p50_ms']:.0f} / {r['ttft_later_p99_ms']:.0f} | "
              f"{r['output_tok_s']:.1f} | {h['device']:.0%} / {h['host']:.0%} / "
              f"{h['storage']:.0%} |")
    if len(rounds) > 1:
        print("\n| configuration | later-turn TTFT p50 per round (ms) | vs the first "
              "configuration in the same round |")
        print("|---|---|---|")
        for c, r in enumerate(results):
            per = [rnd[c]["ttft_later_p50_ms"] for rnd in rounds]
            ratio = [rnd[c]["ttft_later_p50_ms"] / rnd[0]["ttft_later_p50_ms"]
                     for rnd in rounds if rnd[0]["ttft_later_p50_ms"] > 0]
            print(f"| `{r['flags']}` | {' / '.join(f'{v:.0f}' for v in per)} | "
                  f"{' / '.join(f'{v:.2f}x' for v in ratio)} |")
    if any(r.get("phases") for rnd in rounds for r in rnd):
        print("\nLater turns, medians in ms (server: --enable-request-time-stats-logging; "
              "http: the client's TTFT less the server's):\n")
        names = (*PHASES, "http", "client ttft")
        print("| configuration | round | " + " | ".join(names) + " |")
        print("|---|---|" + "---|" * len(names))
        for c in range(len(configs)):
            for rnd in rounds:
                ph = rnd[c].get("phases") or {}
                print(f"| `{rnd[c]['flags']}` | {rnd[c]['round']} | " + " | ".join(
                    f"{ph[k]:.1f}" if k in ph else "" for k in names) + " |")
    if len(results) > 1 and results[0]["ttft_later_p50_ms"] > 0:
        for r in results[1:]:
            print(f"\nlater-turn TTFT p50 of `{r['flags']}`: "
                  f"{r['ttft_later_p50_ms'] / results[0]['ttft_later_p50_ms']:.2f}x the first "
                  "configuration's")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"median": results, "rounds": rounds}, fh, indent=1)


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's rounds: the median of each figure (the first round's flags)."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "round":
            out[key] = statistics.median(r[key] for r in runs)
    out["hit"] = {k: statistics.median(r["hit"][k] for r in runs) for k in runs[0]["hit"]}
    out.pop("phases", None)
    return out


if __name__ == "__main__":
    main()
