"""Ours beside llama.cpp on CPU: the same GGUF, 2 threads, one run, one markdown table.

Both servers are real HTTP servers started by this script, measured in interleaved rounds
(ours, llama.cpp, ours, llama.cpp...; each round starts each server afresh); every figure is the
median over the rounds:

* start-up: launch to the first 200 (``/health`` for ours, ``/v1/models`` for llama.cpp);
* batch-1 decode: ms/token of one streamed greedy ``/v1/completions`` request of
  ``--max-tokens`` tokens, (t_last - t_first) / (chunks - 1), after one warm-up request;
* TTFT of a prompt of exactly ``--prompt-tokens`` tokens (our tokenizer; a different prompt
  every time, so neither server's prefix cache helps), streamed, median of 3 per round;
* aggregate tok/s of 1/4/8/16 concurrent streams (output chunks / wall time);
* peak RSS: the sum of VmHWM over the server process and its children, sampled.

EOS is suppressed so every request makes exactly ``--max-tokens`` tokens: ``ignore_eos`` for
ours, a -100 ``logit_bias`` on the end tokens for llama.cpp (its server has no ``ignore_eos``).

llama.cpp is ``llama-cpp-python[server]`` (``python -m llama_cpp.server``, 2 threads, our
context length) installed into its own venv ``<cache>/llamacpp-venv`` (the engine cache:
``$ENGINE_CACHE_DIR`` or ``~/.cache/engine``) from a wheel in ``<cache>/wheels/``, built there
once when none is found (``pip wheel --no-deps llama-cpp-python`` with
``CMAKE_ARGS=-DGGML_NATIVE=ON``, about 10 minutes). It is started with ``--logits_all False``
(its default keeps every prompt position's logits, which serving does not need) and
``--interrupt_requests False`` (its default cancels the streaming request when another
arrives). That server runs one request at a time (no continuous batching): concurrent streams
queue behind each other, which is what the concurrent rows measure. The wheel ships no
``llama-server`` executable (the C++ server with continuous batching), so it is not measured.

Machine load: the 1-minute load average before the start and during the run, and the CPU time
of other processes (``/proc/stat`` busy time minus the CPU time of this script, its servers and
its own busy process), in cores. Ratios and target checks are withheld ("n/a (load X)") when
the load average at the start exceeded ``--max-load`` or other processes used more than half a
core on average: the raw numbers are printed either way.

``--contention``: the batch-1 decode measured again, in the same round, with a competing busy
process (``python -c 'while True: pass'``, in a session of its own like a program started from
another terminal) running, for both servers, and the slowdown (``--contention-tokens`` tokens,
16: a server that waits for a preempted thread at every barrier takes seconds per token).

``--nice -15`` (root), on a machine shared with other work: this script, its servers and its
busy process run at that niceness (their autogroups too), ahead of the other work: closer to
a quiet machine. The load figures then still count the other work, and ratios stay withheld
when it was there; the numbers are better, not clean.

    python benchmarks/cpu_vs_llamacpp.py [--rounds 3] [--quick] [--contention]
        [--nice N] [--ours-args "..."] [--llama-args "..."]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from _server import (  # here
    ProcTree,
    cpu_seconds,
    free_port,
    new_session,
    prioritize,
    stop,
    wait_ready,
)

THREADS = 2
DECODE_PROMPT = "The history of the city begins with a small settlement on the river, where"
STREAM_PROMPTS = ["Write a short story about a robot learning to paint.",
                  "Explain how a bicycle works.", "List some facts about the planet Mars.",
                  "Describe a walk through a forest in autumn.", "What makes a good cup of tea?",
                  "Tell me about the history of the printing press.",
                  "Give advice to a new gardener.", "Describe the sound of the ocean."]
FILLER = ("the old road ran along the river past the mill and the farms to the town where "
          "people met on market day to trade grain wool and news of the world ")


# ---------------------------------------------------------------- llama.cpp installation

def cache_dir() -> str:
    from engine.api import cache_dir as engine_cache_dir

    return engine_cache_dir()


def llama_venv(cache: str) -> str:
    """The python of ``<cache>/llamacpp-venv`` with llama-cpp-python[server] installed: from the
    newest wheel in ``<cache>/wheels/``, built there first if there is none."""
    venv = os.path.join(cache, "llamacpp-venv")
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and subprocess.run(
            [py, "-c", "import llama_cpp.server.app"], capture_output=True).returncode == 0:
        return py
    wheels_dir = os.path.join(cache, "wheels")
    os.makedirs(wheels_dir, exist_ok=True)
    wheels = sorted(glob.glob(os.path.join(wheels_dir, "llama_cpp_python-*.whl")),
                    key=os.path.getmtime)
    if not wheels:
        print(f"no llama-cpp-python wheel in {wheels_dir}: building one (pip wheel --no-deps "
              "llama-cpp-python, CMAKE_ARGS=-DGGML_NATIVE=ON); this takes about 10 minutes",
              flush=True)
        env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels_dir,
                        "llama-cpp-python"], env=env, check=True)
        wheels = sorted(glob.glob(os.path.join(wheels_dir, "llama_cpp_python-*.whl")),
                        key=os.path.getmtime)
    print(f"installing {os.path.basename(wheels[-1])}[server] into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", f"{wheels[-1]}[server]"], check=True)
    return py


def llama_server_binary(py: str) -> str | None:
    """A ``llama-server`` executable shipped in the venv (the wheel), if any."""
    venv = os.path.dirname(os.path.dirname(py))
    for path in glob.glob(os.path.join(venv, "**", "llama-server"), recursive=True):
        if os.access(path, os.X_OK):
            return path
    return None


# ---------------------------------------------------------------- machine load

def _proc_stat() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine since boot."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / tick, sum(v[:8]) / tick


class Load:
    """The machine's load over the run: load averages sampled every second, and the CPU time
    of processes other than ours (/proc/stat busy time minus ours), in cores."""

    def __init__(self):
        self.start_loadavg = os.getloadavg()
        self.loadavg: list[float] = []
        self.ours: set[int] = set()          # pids whose CPU time is ours (servers, busy loop)
        self.ours_cpu: dict[int, float] = {}
        self.t0, self.busy0 = time.perf_counter(), _proc_stat()[0]
        self.self0 = sum(os.times()[:2])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def track(self, pid: int) -> None:
        self.ours.add(pid)

    def _sample(self) -> None:
        self.loadavg.append(os.getloadavg()[0])
        from _server import _children

        for root in list(self.ours):
            for p in [root, *_children(root)]:
                c = cpu_seconds(p)
                if c:
                    self.ours_cpu[p] = max(self.ours_cpu.get(p, 0.0), c)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def close(self) -> dict:
        self._sample()
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self.t0
        busy = _proc_stat()[0] - self.busy0
        ours = sum(self.ours_cpu.values()) + sum(os.times()[:2]) - self.self0
        return {"start": self.start_loadavg[0], "max": max(self.loadavg or [0.0]),
                "busy_cores": busy / wall, "others_cores": max(0.0, (busy - ours) / wall),
                "wall": wall}


def busy_process(load: Load, nice: int) -> subprocess.Popen:
    """``python -c 'while True: pass'`` in a session of its own (another terminal's program)."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                         preexec_fn=lambda: new_session(nice))
    load.track(p.pid)
    return p


# ---------------------------------------------------------------- servers

class Server:
    """One server kind: how to start it, where it is ready, what its requests add."""

    def __init__(self, name: str, cmd, ready_path: str, extra: dict):
        self.name, self.cmd, self.ready_path, self.extra = name, cmd, ready_path, extra

    def start(self, load: Load, ctx: int | None):
        port = free_port()
        log = tempfile.NamedTemporaryFile(prefix=f"bench-{self.name}-", suffix=".log",
                                          delete=False)
        t0 = time.perf_counter()
        proc = subprocess.Popen(self.cmd(port, ctx), stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONWARNINGS="ignore"))
        load.track(proc.pid)
        tree = ProcTree(proc.pid)
        url = f"http://127.0.0.1:{port}"
        if not wait_ready(proc, url, log.name, poll_s=0.05, path=self.ready_path):
            tree.close()
            raise SystemExit(f"{self.name} did not start: {shlex.join(self.cmd(port, ctx))}")
        return proc, tree, url, time.perf_counter() - t0, log.name


def stream(client: httpx.Client, body: dict) -> tuple[float, list[float]]:
    """Send one streamed /v1/completions request: (send time, arrival time of every chunk
    that carries text)."""
    t0 = time.perf_counter()
    times = []
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            item = json.loads(line[6:])
            if item.get("choices") and item["choices"][0].get("text"):
                times.append(time.perf_counter())
    return t0, times


def decode_ms(client, server: Server, max_tokens: int) -> float:
    body = {"prompt": DECODE_PROMPT, "max_tokens": max_tokens, "temperature": 0,
            **server.extra}
    _, times = stream(client, body)
    if len(times) != max_tokens:
        print(f"  note: {server.name} streamed {len(times)} chunks for {max_tokens} tokens",
              file=sys.stderr)
    return (times[-1] - times[0]) / max(1, len(times) - 1) * 1000


def concurrent_tps(client, server: Server, n: int, max_tokens: int, round_no: int) -> float:
    bodies = [{"prompt": f"{STREAM_PROMPTS[i % len(STREAM_PROMPTS)]} ({round_no}.{i})",
               "max_tokens": max_tokens, "temperature": 0, **server.extra} for i in range(n)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda b: stream(client, b), bodies))
    return sum(len(r[1]) for r in results) / (time.perf_counter() - t0)


def long_prompts(n_tokens: int, count: int) -> list[str]:
    """``count`` different texts of exactly ``n_tokens`` tokens (our tokenizer: the GGUF's)."""
    from engine.models.config import default_model_path
    from transformers import AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    out = []
    for i in range(count):
        words = f"Record {i * 7919 % 1000}: {FILLER * (n_tokens // 10)}".split(" ")
        lo, hi = 1, len(words)  # longest word prefix with at most n_tokens tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(tok.encode(" ".join(words[:mid]), add_special_tokens=False)) <= n_tokens:
                lo = mid
            else:
                hi = mid - 1
        text = " ".join(words[:lo])
        while len(tok.encode(text, add_special_tokens=False)) < n_tokens:
            text += " a"
        assert len(tok.encode(text, add_special_tokens=False)) == n_tokens
        out.append(text)
    return out


def ttft_ms(client, server: Server, prompt: str) -> float:
    t0, times = stream(client, {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                **server.extra})
    return (times[0] - t0) * 1000


def prompt_tokens(client, server: Server, prompt: str) -> int | None:
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                              "temperature": 0, **server.extra})
    return (r.json().get("usage") or {}).get("prompt_tokens")


def measure(server: Server, args, load: Load, ctx: int | None, round_no: int,
            prompts: list[str]) -> dict:
    proc, tree, url, startup, log = server.start(load, ctx)
    res = {"startup": startup}
    try:
        client = httpx.Client(base_url=url, timeout=1200,
                              limits=httpx.Limits(max_connections=64))
        if ctx is None:  # ours: its context length, which llama.cpp is then given
            res["ctx"] = client.get("/v1/models").json()["data"][0]["max_model_len"]
        decode_ms(client, server, 8)  # warm-up
        res["decode"] = decode_ms(client, server, args.max_tokens)
        if args.contention:
            busy = busy_process(load, args.nice)
            try:
                time.sleep(0.5)
                res["decode_contended"] = decode_ms(client, server, args.contention_tokens)
            finally:
                busy.kill()
                busy.wait()
        if round_no == 0:
            res["prompt_tokens"] = prompt_tokens(client, server, prompts[0])
        res["ttft"] = statistics.median(ttft_ms(client, server, p)
                                        for p in prompts[1 + 3 * round_no:4 + 3 * round_no])
        for n in args.streams:
            res[f"tps{n}"] = concurrent_tps(client, server, n, args.max_tokens, round_no)
        client.close()
    finally:
        tree.close()
        res["rss"] = tree.peak_rss_mib
        stop(proc)
        os.unlink(log)
    return res


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="1 round, 32 tokens, 1 and 8 streams: a short run to try the script")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--streams", default="1,4,8,16", help="concurrent stream counts")
    ap.add_argument("--contention", action="store_true",
                    help="also batch-1 decode with a competing busy process, and the slowdown")
    ap.add_argument("--contention-tokens", type=int, default=16,
                    help="tokens of the contended decode request (a slowed server can take "
                         "seconds per token)")
    ap.add_argument("--max-load", type=float, default=1.0,
                    help="withhold ratios when the 1-minute load average at the start exceeds "
                         "this (default 1.0, for 2 cores)")
    ap.add_argument("--nice", type=int, default=0,
                    help="on a shared machine: run this script, its servers and its busy process "
                         "at this niceness, autogroups included (negative: root)")
    ap.add_argument("--ours-args", default="", help="extra flags for engine serve (one string)")
    ap.add_argument("--llama-args", default="", help="extra flags for llama_cpp.server")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.max_tokens, args.streams = 1, 32, "1,8"
    args.streams = [int(n) for n in args.streams.split(",")]
    if args.nice:
        try:
            os.setsid()  # an autogroup of our own, then its priority
        except OSError:
            pass
        prioritize(args.nice)

    from engine.models.config import default_model_path

    gguf = default_model_path()
    py = llama_venv(cache_dir())
    binary = llama_server_binary(py)
    engine_bin = os.path.join(os.path.dirname(sys.executable), "engine")
    eos = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|> of SmolLM2
    ours = Server("ours", lambda port, ctx: [engine_bin, "serve", "--port", str(port),
                                             *shlex.split(args.ours_args)],
                  "/health", {"ignore_eos": True})
    llama = Server("llama.cpp", lambda port, ctx: [
        py, "-m", "llama_cpp.server", "--model", gguf, "--n_threads", str(THREADS),
        "--n_threads_batch", str(THREADS), "--n_ctx", str(ctx), "--port", str(port),
        "--logits_all", "False", "--interrupt_requests", "False",
        *shlex.split(args.llama_args)], "/v1/models",
        {"logit_bias": eos, "repeat_penalty": 1.0, "top_k": 1})
    prompts = long_prompts(args.prompt_tokens, 1 + 3 * args.rounds)

    load = Load()
    results: dict[str, list[dict]] = {"ours": [], "llama.cpp": []}
    ctx = None
    for r in range(args.rounds):
        for server in (ours, llama):
            res = measure(server, args, load, ctx if server is llama else None, r, prompts)
            ctx = res.get("ctx", ctx)
            results[server.name].append(res)
            print(f"round {r + 1}/{args.rounds} {server.name}: " + ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in res.items()), flush=True)
    ld = load.close()
    report(args, results, ld, gguf, ctx, binary)
    return 0


def report(args, results, ld, gguf, ctx, binary) -> None:
    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[side])

    loaded = ld["start"] > args.max_load or ld["others_cores"] > 0.5
    why = f"n/a (load {ld['start']:.1f}, others {ld['others_cores']:.2f} cores)"

    rows = []  # (measure, ours, llama, ratio, target, met)

    def row(name, key, fmt, target="", check=None, ratio=True):
        a, b = med("ours", key), med("llama.cpp", key)
        r = why if loaded else (f"{a / b:.2f}x" if ratio else "")
        met = "" if check is None else (why if loaded else ("yes" if check(a, b) else "no"))
        rows.append((name, fmt.format(a), fmt.format(b), r, target, met))

    row("batch-1 decode, ms/token", "decode", "{:.1f}", "≤ llama.cpp", lambda a, b: a <= b)
    if args.contention:
        row("batch-1 decode with a busy process, ms/token", "decode_contended", "{:.1f}")
        sa = statistics.median(r["decode_contended"] / r["decode"] for r in results["ours"])
        sb = statistics.median(r["decode_contended"] / r["decode"] for r in results["llama.cpp"])
        rows.append(("  slowdown (contended / quiet)", f"{sa:.2f}x", f"{sb:.2f}x",
                     why if loaded else f"{sa / sb:.2f}x", "≤ 2.5x",
                     why if loaded else ("yes" if sa <= 2.5 else "no")))
    row(f"TTFT, {args.prompt_tokens}-token prompt, ms", "ttft", "{:.0f}", "≤ llama.cpp",
        lambda a, b: a <= b)
    best = max(med("llama.cpp", f"tps{n}") for n in args.streams)
    for n in args.streams:
        if n == 8:
            row(f"{n} concurrent streams, tok/s", f"tps{n}", "{:.1f}",
                f"≥ 1.5x llama.cpp's best ({1.5 * best:.1f})", lambda a, b: a >= 1.5 * best)
        else:
            row(f"{n} concurrent stream{'s' if n > 1 else ''}, tok/s", f"tps{n}", "{:.1f}")
    row("start-up to ready, s", "startup", "{:.2f}", "≤ 2 s", lambda a, b: a <= 2.0)
    row("peak RSS, MiB", "rss", "{:.0f}", "≤ 1.5x llama.cpp", lambda a, b: a <= 1.5 * b)

    pt = (results["ours"][0].get("prompt_tokens"), results["llama.cpp"][0].get("prompt_tokens"))
    print()
    shipped = (f"a llama-server binary is in the venv ({binary}), not measured" if binary
               else "no llama-server binary in the wheel")
    print(f"model {os.path.basename(gguf)}, {THREADS} threads, llama.cpp n_ctx {ctx} "
          f"(python -m llama_cpp.server, one request at a time; {shipped}), "
          f"{args.rounds} round(s), {args.max_tokens} tokens/request, medians")
    print(f"prompt tokens of the TTFT prompt as each server counted them: ours {pt[0]}, "
          f"llama.cpp {pt[1]}")
    print(f"machine: {os.cpu_count()} CPUs; 1-min load average at start {ld['start']:.2f}, "
          f"max during the run {ld['max']:.2f} (includes our own servers); busy "
          f"{ld['busy_cores']:.2f} cores on average, of which other processes "
          f"{ld['others_cores']:.2f}; {ld['wall']:.0f} s"
          + ("; RATIOS WITHHELD: the machine was loaded" if loaded else ""))
    print()
    print("| measure | ours | llama.cpp | ours / llama.cpp | target | met |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    sys.exit(main())
