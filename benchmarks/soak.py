"""Soak benchmark on CPU: many concurrent clients against a real ``engine serve`` for minutes;
prints one table and exits 1 when a bar fails.

The server serves the default model (``--device cpu --attention-backend torch_native``, no
keys) with a KV pool of ``--kv-tokens`` (16384: under the full load the pool fills and the
radix cache evicts, paths the KV bar then covers). Then:

1. four fixed greedy requests (cache flushed first) record the reference outputs;
2. warm-up: ``--warmup-s`` seconds of the soak load, not counted; the server's RSS is read;
3. the soak: ``--clients`` concurrent clients send requests back to back for ``--minutes``:
   the three generation routes, streamed or not; prompts of a few words to ~2000 tokens, some
   sharing a long prefix; greedy, temperature/top_p/top_k or penalised sampling, stop strings,
   seeds, ``n=2``, logprobs (half of them with the prompt's own: ``echo``, or
   ``logprob_start_len``) and logit biases now and then, 1..128 new tokens; about one request in ten
   leaves early (a stream after a few events, a plain request after a short wait);
4. once the server is idle: its RSS again, the KV pool (used minus cached tokens is 0; after
   ``/flush_cache`` nothing is used), and the four greedy requests again.

Bars: no 5xx, no error event or unfinished stream in a 200, no transport error, no request
without an answer within ``--request-timeout`` seconds; RSS grows by less than 5 %; the KV pool
is fully returned; the greedy outputs are unchanged.

    python benchmarks/soak.py [--minutes 10] [--clients 64] [-- extra serve flags]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from _server import free_port, stop, wait_ready  # this folder, on the path when run as a script

GEN, COMPL, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
WORDS = ("the a of river stone light city music garden winter bright quiet old new small "
         "machine learning story history water mountain friend road window evening morning "
         "because while after before under over through people language number simple "
         "question answer reason paper engine forest ocean").split()
#: long shared prefixes (the radix cache serves them to later requests)
DOCUMENTS = [" ".join(random.Random(i).choices(WORDS, k=300)) for i in range(3)]
STOPS = [".", "\n", " and", "!", " the"]
GREEDY = [  # (path, body): the fixed requests compared before and after the soak
    (GEN, {"text": "The sea is", "sampling_params": {"temperature": 0, "max_new_tokens": 32}}),
    (GEN, {"text": "A list of colors: red,", "sampling_params": {"temperature": 0,
                                                                  "max_new_tokens": 32}}),
    (COMPL, {"prompt": "Winter mornings are", "max_tokens": 32, "temperature": 0}),
    (CHAT, {"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 32,
            "temperature": 0}),
]
RSS_GROWTH_BAR = 0.05


# ---------------------------------------------------------------------- the request mix

def prompt_text(rng: random.Random) -> str:
    """A few words (half the prompts), ~40-160 tokens, or ~300-800 tokens; a third of the
    longer ones start with one of the shared documents (~400 tokens)."""
    k = rng.choice([rng.randint(2, 15)] * 10 + [rng.randint(30, 120)] * 7 +
                   [rng.randint(250, 600)] * 3)
    words = " ".join(rng.choices(WORDS, k=k))
    if k > 15 and rng.random() < 1 / 3:
        return f"{rng.choice(DOCUMENTS)}\n\nQuestion: {words}?"
    return words


def sampling(rng: random.Random) -> dict[str, Any]:
    """OpenAI-named sampling fields (``logprobs`` is the number of top logprobs, or absent)."""
    sp: dict[str, Any] = {"max_tokens": rng.randint(1, 128)}
    kind = rng.choice(["greedy", "random", "penalties"])
    if kind == "greedy":
        sp["temperature"] = 0
    elif kind == "random":
        sp.update(temperature=rng.choice([0.3, 0.7, 1.0, 1.5]), top_p=rng.choice([0.5, 0.9, 1]),
                  top_k=rng.choice([-1, 1, 20, 50]))
    else:
        sp.update(temperature=rng.choice([0, 0.8]), repetition_penalty=rng.choice([0.9, 1.2]),
                  frequency_penalty=rng.choice([-0.5, 0.5]),
                  presence_penalty=rng.choice([0, 1.0]))
    if rng.random() < 0.25:
        sp["stop"] = rng.sample(STOPS, rng.randint(1, 2))
    if rng.random() < 0.2:
        sp["seed"] = rng.randrange(2**63)
    if rng.random() < 0.2:
        sp["ignore_eos"] = True
    if rng.random() < 0.1:
        sp["n"] = 2
    if rng.random() < 0.1:
        sp["logprobs"] = rng.randint(0, 5)
    if rng.random() < 0.1:  # a few tokens banned or pushed (ids of the default model's vocabulary)
        sp["logit_bias"] = {str(rng.randrange(49152)): rng.choice([-100, -5, 5, 100])
                            for _ in range(rng.randint(1, 4))}
    return sp


@dataclass
class Spec:
    path: str
    body: dict[str, Any]
    stream: bool
    #: leave early: after this many events (a stream) or seconds (a plain request)
    leave_after: float | None


def make_spec(rng: random.Random) -> Spec:
    path = rng.choice([GEN, COMPL, CHAT])
    sp, stream = sampling(rng), rng.random() < 0.5
    leave_after = None
    if rng.random() < 0.1:
        leave_after = rng.randint(1, 8) if stream else rng.uniform(0.2, 3.0)
    top = sp.pop("logprobs", None)
    score = top is not None and rng.random() < 0.5  # the prompt's own logprobs too
    if path == GEN:
        sp["max_new_tokens"] = sp.pop("max_tokens")
        body = {"text": prompt_text(rng), "sampling_params": sp, "stream": stream}
        if top is not None:
            body.update(return_logprob=True, top_logprobs_num=top)
        if score:
            body["logprob_start_len"] = rng.choice([0, 1])
    elif path == COMPL:
        body = {"prompt": prompt_text(rng), "stream": stream, **sp}
        if top is not None:
            body["logprobs"] = top
        if score:  # (an evaluation harness's request: the echoed prompt scored, often alone)
            body.update(echo=True, max_tokens=rng.choice([0, body["max_tokens"]]))
    else:
        turns = [{"role": "user", "content": prompt_text(rng)}]
        if rng.random() < 0.3:
            turns = [{"role": "system", "content": "You answer briefly."}, *turns,
                     {"role": "assistant", "content": prompt_text(rng)},
                     {"role": "user", "content": "And then?"}]
        body = {"messages": turns, "stream": stream, **sp}
        if top is not None:
            body.update(logprobs=True, top_logprobs=top)
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return Spec(path, body, stream, leave_after)


# ---------------------------------------------------------------------- running the load

@dataclass
class Tally:
    status: Counter[int] = field(default_factory=Counter)
    disconnects: int = 0
    disconnects_before_answer: int = 0  #: plain requests left before their answer came
    broken_streams: list[str] = field(default_factory=list)  #: error events, no [DONE]
    transport_errors: list[str] = field(default_factory=list)
    hangs: int = 0
    latencies: list[float] = field(default_factory=list)  #: requests answered in full
    ttfts: list[float] = field(default_factory=list)  #: streams, to the first generated text

    @property
    def sent(self) -> int:
        return sum(self.status.values()) + len(self.transport_errors) + self.hangs + \
            self.disconnects_before_answer


def has_output(path: str, event: dict[str, Any]) -> bool:
    """Whether a stream event carries generated text (or token ids)."""
    if path == GEN:
        return bool(event.get("output_ids"))
    return any(c.get("text") or (c.get("delta") or {}).get("content")
               for c in event.get("choices", []))


async def send(client: httpx.AsyncClient, spec: Spec, tally: Tally) -> None:
    t0 = time.perf_counter()
    if not spec.stream:
        try:
            async with asyncio.timeout(spec.leave_after):
                r = await client.post(spec.path, json=spec.body)
        except TimeoutError:
            tally.disconnects += 1
            tally.disconnects_before_answer += 1
            return
        tally.status[r.status_code] += 1
        if r.status_code == 200:
            tally.latencies.append(time.perf_counter() - t0)
        return
    async with client.stream("POST", spec.path, json=spec.body) as r:
        tally.status[r.status_code] += 1
        if r.status_code != 200:
            await r.aread()
            return
        outputs = 0  #: events with generated text
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                tally.latencies.append(time.perf_counter() - t0)
                return
            event = json.loads(line[6:])
            if "error" in event:
                tally.broken_streams.append(f"{spec.path}: {line[:300]}")
            if has_output(spec.path, event):
                outputs += 1
                if outputs == 1:
                    tally.ttfts.append(time.perf_counter() - t0)
                if spec.leave_after is not None and outputs >= spec.leave_after:
                    tally.disconnects += 1
                    return  # closing the response drops the connection
    tally.broken_streams.append(f"{spec.path}: the stream ended without [DONE]")


async def client_loop(client: httpx.AsyncClient, rng: random.Random, until: float,
                      tally: Tally, limit_s: float) -> None:
    while time.monotonic() < until:
        spec = make_spec(rng)
        try:
            async with asyncio.timeout(limit_s):  # the hang guard
                await send(client, spec, tally)
        except TimeoutError:
            tally.hangs += 1
        except httpx.HTTPError as exc:
            tally.transport_errors.append(f"{spec.path}: {type(exc).__name__}: {exc}")
            if isinstance(exc, httpx.ConnectError):  # the server is gone
                return


async def run_load(label: str, url: str, clients: int, seconds: float, seed: int,
                   limit_s: float) -> Tally:
    """``clients`` loops for ``seconds`` (each then finishes its request); progress on stderr
    once a minute."""
    tally = Tally()
    start = time.monotonic()
    until = start + seconds
    limits = httpx.Limits(max_connections=clients, keepalive_expiry=2)  # the server's is 5 s

    async def progress() -> None:
        while True:
            print(f"{label}: {(time.monotonic() - start) / 60:.0f} min, {tally.sent} requests",
                  file=sys.stderr)
            await asyncio.sleep(60)

    reporter = asyncio.ensure_future(progress())
    async with httpx.AsyncClient(base_url=url, timeout=limit_s, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, random.Random(seed * 1000 + i), until,
                                           tally, limit_s) for i in range(clients)))
    reporter.cancel()
    return tally


# ---------------------------------------------------------------------- server-side checks

def greedy_outputs(client: httpx.Client) -> list[str]:
    """The texts of the fixed greedy requests, sent one by one on a flushed cache."""
    client.post("/flush_cache").raise_for_status()
    texts = []
    for path, body in GREEDY:
        r = client.post(path, json=body)
        r.raise_for_status()
        out = r.json()
        texts.append(out["text"] if path == GEN else out["choices"][0]["text"] if path == COMPL
                     else out["choices"][0]["message"]["content"])
    return texts


def scheduler(client: httpx.Client) -> dict[str, Any]:
    return client.get("/get_server_info").json()["scheduler"]


def wait_idle(client: httpx.Client, timeout_s: float) -> dict[str, Any]:
    """The scheduler's stats once nothing runs or waits (aborts land within a step or two)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = scheduler(client)
        if stats["num_running"] == stats["num_waiting"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


def generated_tokens(client: httpx.Client) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in client.get("/metrics").text.splitlines()
               if line.startswith("engine_generation_tokens_total"))


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# ---------------------------------------------------------------------- main

def soak(url: str, pid: int, args: argparse.Namespace) -> list[tuple[str, str, bool | None]]:
    """Run the phases; return the table rows (measure, value, bar passed or None)."""
    server = psutil.Process(pid)
    with httpx.Client(base_url=url, timeout=args.request_timeout) as client:
        before = greedy_outputs(client)
        asyncio.run(run_load("warm-up", url, args.clients, args.warmup_s, args.seed + 1,
                             args.request_timeout))
        wait_idle(client, args.request_timeout)
        rss0 = server.memory_info().rss
        tokens0, t0 = generated_tokens(client), time.perf_counter()
        tally = asyncio.run(run_load("soak", url, args.clients, args.minutes * 60, args.seed,
                                     args.request_timeout))
        wall = time.perf_counter() - t0
        idle = wait_idle(client, args.request_timeout)
        tokens = generated_tokens(client) - tokens0
        rss1 = server.memory_info().rss
        client.post("/flush_cache").raise_for_status()
        flushed = scheduler(client)
        after = greedy_outputs(client)

    codes = sorted(tally.status.items())
    five = sum(n for code, n in codes if code >= 500)
    growth = rss1 / rss0 - 1
    held = idle["kv_used_tokens"] - idle["kv_cached_tokens"]
    mib = 2**20
    for problem in [*tally.broken_streams, *tally.transport_errors][:10]:
        print(problem, file=sys.stderr)
    return [
        ("clients x duration", f"{args.clients} x {wall / 60:.1f} min (after "
         f"{args.warmup_s:g} s of warm-up)", None),
        ("requests sent", str(tally.sent), None),
        ("  answered, by status", ", ".join(f"{c}: {n}" for c, n in codes) or "none", None),
        ("  5xx", str(five), five == 0),
        ("  streams with an error event or no [DONE]", str(len(tally.broken_streams)),
         not tally.broken_streams),
        ("  transport errors", str(len(tally.transport_errors)), not tally.transport_errors),
        (f"  no answer within {args.request_timeout:g} s", str(tally.hangs), tally.hangs == 0),
        ("  clients that left early", f"{tally.disconnects} ({tally.disconnects_before_answer} "
         "before the answer)", None),
        ("tokens generated (server counter)", f"{tokens:.0f}", None),
        ("throughput", f"{tokens / wall:.1f} tok/s, {tally.sent / wall:.2f} req/s", None),
        ("latency of full answers p50 / p99", f"{percentile(tally.latencies, 50):.2f} s / "
         f"{percentile(tally.latencies, 99):.2f} s", None),
        ("TTFT of streams p50 / p99", f"{percentile(tally.ttfts, 50):.2f} s / "
         f"{percentile(tally.ttfts, 99):.2f} s", None),
        ("server RSS after warm-up -> at the end", f"{rss0 / mib:.0f} MiB -> {rss1 / mib:.0f} "
         f"MiB ({growth:+.1%})", growth < RSS_GROWTH_BAR),
        ("idle: running / waiting requests", f"{idle['num_running']} / {idle['num_waiting']}",
         idle["num_running"] == idle["num_waiting"] == 0),
        ("idle: KV tokens used - cached", f"{idle['kv_used_tokens']} - "
         f"{idle['kv_cached_tokens']} = {held}", held == 0),
        ("requests retracted (no KV slot for a decode step)", str(idle["num_retractions"]),
         None),
        ("after /flush_cache: KV tokens used", str(flushed["kv_used_tokens"]),
         flushed["kv_used_tokens"] == 0),
        ("greedy outputs before = after", f"{sum(a == b for a, b in zip(before, after))} of "
         f"{len(GREEDY)} identical", before == after),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--warmup-s", type=float, default=60)
    ap.add_argument("--request-timeout", type=float, default=1800,
                    help="seconds a request may take before it counts as a hang (far beyond "
                    "any answer on a busy 2-core machine)")
    ap.add_argument("--kv-tokens", type=int, default=16384,
                    help="the server's KV pool: small enough that it fills and the radix cache "
                    "evicts under the full load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("serve_args", nargs="*", help="extra flags for engine serve (after --)")
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="engine-soak-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "engine.cli.main", "serve", "--port", str(port),
           "--device", "cpu", "--attention-backend", "torch_native",
           "--max-total-tokens", str(args.kv_tokens), *args.serve_args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    try:
        if not wait_ready(proc, url, log.name):
            return 1
        rows = soak(url, proc.pid, args)
    except httpx.ConnectError:
        if proc.poll() is None:
            raise
        print(open(log.name).read()[-3000:], file=sys.stderr)
        rows = [("the server", f"exited with status {proc.returncode}", False)]
    finally:
        stop(proc)
        with open(log.name, errors="replace") as f:
            lines = f.readlines()
        os.unlink(log.name)
    errors = [line for line in lines
              if "Traceback" in line or " ERROR " in line or line.startswith("ERROR")]
    rows.append(("server log: errors and tracebacks", str(len(errors)), not errors))
    for line in errors[:10]:
        print(line.rstrip(), file=sys.stderr)

    width = max(len(r[0]) for r in rows)
    print(f"soak: engine serve, default model, cpu, {args.clients} clients, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'measure'.ljust(width)} | {'value'.ljust(44)} | bar")
    print(f"{'-' * width}-|-{'-' * 44}-|-----")
    for name, value, ok in rows:
        bar = "" if ok is None else "pass" if ok else "FAIL"
        print(f"{name.ljust(width)} | {value.ljust(44)} | {bar}")
    return 0 if all(ok is not False for _, _, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
