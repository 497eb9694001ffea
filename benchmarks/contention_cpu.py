"""Batch-1 decode of our ModelRunner on CPU, quiet and with a competing busy process, for
several OpenMP settings: one markdown table of medians over interleaved rounds.

Every setting runs in a fresh Python (the OpenMP environment is read when torch loads its
runtime): it loads the default model (SmolLM2-135M-Instruct Q4_1 GGUF, the ``gguf`` plugin,
torch_native attention, the loop of benchmarks/decode_cpu.py), decodes ``--steps`` tokens
quiet, then again while ``python -c 'while True: pass'`` runs (in a session of its own, as a
program started from another terminal: with scheduler autogroups, the kernel shares the CPU
between sessions first), and prints the two medians.

Settings (``--settings`` picks some): ``engine`` (what ``engine serve`` does: libgomp's own
defaults and the team sizer of engine.runtime.cpu_threads), ``libgomp`` (libgomp's own
defaults, a fixed team: what ``engine serve`` did before the sizer), ``passive``
(OMP_WAIT_POLICY=PASSIVE), ``spin<N>`` (GOMP_SPINCOUNT=N), ``threads1`` (one thread),
``adaptive[-<setting>]`` (engine.runtime.cpu_threads.CpuThreads sizing the team to the free
cores before every forward, over another setting's environment).

On a machine shared with other work, ``--nice -15`` (root) gives the autogroups of each
measured process and of its busy competitor that nice value (with autogroups, a process's own
nice value only ranks it within its session): the two then take precedence over the machine's
other work, close to a quiet machine with one busy process, which is the case measured.

    python benchmarks/contention_cpu.py [--rounds 3] [--steps 64] [--settings a,b,...]
        [--nice N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _server import new_session  # this folder, on the path when run as a script

OMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_DYNAMIC",
            "OMP_PROC_BIND")


def setting_env(name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OMP_KEYS}
    env["ENGINE_BENCH_SETTING"] = name
    if name == "engine":  # what engine serve does: libgomp's defaults, the team sizer
        pass
    elif name == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif name.startswith("spin"):
        env["GOMP_SPINCOUNT"] = name[4:]
    elif name == "threads1":
        env["OMP_NUM_THREADS"] = "1"
    elif name.startswith("adaptive"):  # adaptive[-<another setting>]
        env.update({k: v for k, v in setting_env(name.partition("-")[2] or "libgomp").items()
                    if k in OMP_KEYS})
        env["ENGINE_BENCH_SETTING"] = name
    elif name != "libgomp":
        raise SystemExit(f"unknown setting {name}")
    return env


def child(steps: int) -> None:
    import torch
    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    runner = ModelRunner(ServerConfig(device="cpu", dtype="float32", max_total_tokens=4096,
                                      attention_backend="torch_native"))
    forward = runner.forward
    if os.environ["ENGINE_BENCH_SETTING"].startswith(("adaptive", "engine")):
        from engine.runtime.cpu_threads import CpuThreads

        sizer = CpuThreads()

        def forward(batch):
            sizer.update()
            return runner.forward(batch)
    prompt = runner.tokenizer.encode("The history of the city begins with a small "
                                     "settlement on the river, " * 4)[:32]

    def decode() -> float:
        builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        row = builder.new_request()
        tokens = forward(builder.extend([(row, prompt)])).argmax(-1).tolist()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            tokens = forward(builder.decode([(row, tokens[0])])).argmax(-1).tolist()
            times.append(time.perf_counter() - t0)
        builder.free(row)
        runner.req_to_token.zero_()
        return statistics.median(times[2:]) * 1000

    decode()  # warm-up
    quiet = decode()
    threads_q = torch.get_num_threads()
    nice = int(os.environ.get("ENGINE_BENCH_NICE", "0"))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: new_session(nice))
    try:
        time.sleep(0.3)
        contended = decode()
        threads_c = torch.get_num_threads()
    finally:
        busy.kill()
        busy.wait()
    print(json.dumps({"quiet": quiet, "contended": contended,
                      "threads": threads_q, "threads_contended": threads_c}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--settings", default="engine,libgomp,passive,spin1000,spin100,threads1")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness increment of the measured processes (negative: root)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.steps)
        return
    names = args.settings.split(",")
    res: dict[str, list[dict]] = {n: [] for n in names}
    load0, started = os.getloadavg()[0], time.gmtime()
    for r in range(args.rounds):
        for n in names:
            env = {**setting_env(n), "ENGINE_BENCH_NICE": str(args.nice)}
            out = subprocess.run([sys.executable, __file__, "--child", "--steps",
                                  str(args.steps)], env=env, capture_output=True, text=True,
                                 preexec_fn=lambda: new_session(args.nice))
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            res[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {n}: {res[n][-1]}", file=sys.stderr, flush=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', started)}, {os.cpu_count()} CPUs, "
          f"1-min load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end; "
          f"{args.rounds} rounds x {args.steps} steps, medians"
          + (f", measured at nice {args.nice}" if args.nice else ""))
    print("| setting | threads quiet / contended | quiet ms/token | with a busy process ms/token "
          "| slowdown |")
    print("|---|---|---|---|---|")
    for n in names:
        q = statistics.median(x["quiet"] for x in res[n])
        c = statistics.median(x["contended"] for x in res[n])
        s = statistics.median(x["contended"] / x["quiet"] for x in res[n])
        t = f"{res[n][0]['threads']} / {res[n][0]['threads_contended']}"
        print(f"| {n} | {t} | {q:.1f} | {c:.1f} | {s:.2f}x |")


if __name__ == "__main__":
    main()
