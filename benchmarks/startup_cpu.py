"""Start-up of ``engine serve`` on CPU: seconds from launch to the first 200 on ``/health``, the
phases of that time, and the server's peak resident memory. Prints a table.

Each round starts the server twice on one fresh, empty engine cache directory
(``ENGINE_CACHE_DIR``): a *cold* start (plugin manifest, compiled kernels and the tokenizer built
from the GGUF are made and cached) and a *warm* one (all of it read back). The OS page cache is
left as it is (the model file is usually in it after the first round). Figures are medians over
the rounds.

* start -> ready: wall time from launching the process to the first 200 on ``/health``
  (polled every 20 ms);
* phases: from the server's ``start-up phases`` log line (model config, tokenizer, quantization
  method, weights, kv pool, grammar backend, warm-up, http server); ``before the runtime`` is
  the rest (interpreter, imports, argument parsing, plugin discovery);
* peak RSS: ``VmHWM`` of the server process when it is ready (the largest resident set so far).

    python benchmarks/startup_cpu.py [--rounds 3] [--launcher script.py] [-- extra serve flags,
        e.g. --context-length 2048]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from _server import free_port, stop  # this folder, on the path when run as a script

ENGINE = os.path.join(os.path.dirname(sys.executable), "engine")


def start_once(cache: str, flags: list[str], launcher: str | None = None) -> dict[str, float]:
    """One start: {"ready": s, "peak_rss_mib": MiB, phase: s...}."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = os.path.join(cache, f"serve-{port}.log")
    env = {**os.environ, "ENGINE_CACHE_DIR": cache}
    with open(log_path, "w") as log:
        t0 = time.monotonic()
        if launcher is not None:
            cmd = [sys.executable, launcher]
        elif os.path.exists(ENGINE):
            cmd = [ENGINE]
        else:  # no console script (the repository on PYTHONPATH, as on the GPU machine)
            cmd = [sys.executable, "-m", "engine.cli.main"]
        proc = subprocess.Popen([*cmd, "serve", "--port", str(port), *flags], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                if proc.poll() is not None:
                    with open(log_path) as fh:
                        sys.exit(f"the server exited ({proc.returncode}):\n" + fh.read()[-3000:])
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
            ready = time.monotonic() - t0
            with open(f"/proc/{proc.pid}/status") as fh:
                hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM"))
        finally:
            stop(proc)
    with open(log_path) as fh:
        text = fh.read()
    out = {"ready": ready, "peak_rss_mib": hwm / 1024}
    inside = re.search(r"\(([\d.]+) s to ready", text)
    phases = re.search(r"start-up phases \(s\): (.*)", text)
    if inside and phases:
        out["before the runtime"] = ready - float(inside.group(1))
        for item in phases.group(1).split(", "):
            name, _, sec = item.rpartition(" ")
            out[name] = float(sec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launcher", help="a Python script run instead of the engine console "
                    "script (it must take the same arguments), e.g. to measure a variant")
    args, flags = ap.parse_known_args()
    flags = [f for f in flags if f != "--"]
    runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    for _ in range(args.rounds):
        cache = tempfile.mkdtemp(prefix="engine-startup-")
        try:
            runs["cold"].append(start_once(cache, flags, args.launcher))
            runs["warm"].append(start_once(cache, flags, args.launcher))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    keys = [k for k in runs["warm"][0] if k not in ("ready", "peak_rss_mib")]
    load = os.getloadavg()[0]
    print(f"engine serve {' '.join(flags) or '(default model)'}: median of {args.rounds} "
          f"rounds; load average {load:.2f} on {os.cpu_count()} cores")
    print(f"{'':24} {'cold cache':>11} {'warm cache':>11}")

    def row(label: str, key: str, fmt: str) -> None:
        vals = [statistics.median(r.get(key, float("nan")) for r in runs[c])
                for c in ("cold", "warm")]
        print(f"{label:24} " + " ".join(f"{v:>11{fmt}}" for v in vals))

    row("start -> ready (s)", "ready", ".2f")
    for key in keys:
        row(f"  {key}", key, ".3f")
    row("peak RSS (MiB)", "peak_rss_mib", ".0f")
    print("all warm starts (s): " + ", ".join(f"{r['ready']:.2f}" for r in runs["warm"]))


if __name__ == "__main__":
    main()
