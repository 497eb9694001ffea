"""Speculative decoding speed: plain decoding next to NGRAM and STANDALONE, same run.

Every engine is loaded once, in this process; each prompt then runs on every engine in turn
(batch 1, greedy), so a change in the machine's load hits them alike. Per request the decode
rate is ``(tokens - 1) / (time of the last token - time of the first)``, in wall time and in
this process's CPU time (steadier where other programs share the cores); the table gives the
median over prompts and the speed-up over the matching plain engine, with acceptance (draft
tokens accepted per verify, tokens per verify) and a check that every output equals the plain
one.

Workloads: ``grounded`` (repeat or lightly edit a long given text: n-grams match) and
``free`` (open questions: nothing to copy from the prompt).

Engines: ``plain`` and ``ngram`` on the target as given; ``dense`` (the target with
``--quantization unquant``) and ``standalone`` (that dense target with the draft model, by
default the target's own checkpoint loaded as it is: the Q4_1 GGUF drafting for its dense
self).

    python benchmarks/speculative.py [--model PATH] [--draft PATH] [--device cpu|cuda]
        [--max-new-tokens 96] [--prompts 4] [--engines plain,ngram,dense,standalone]
        [--target-args '{"attention_backend": "triton"}'] [--ngram-args '{...}']
        [--standalone-args '{"speculative_num_steps": 5, ...}']

On a shared CPU, ``OMP_NUM_THREADS=1`` gives steadier figures (two OpenMP threads on two busy
cores wait on each other).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Any

TEXTS = [
    "The committee met on Tuesday to review the budget for the new library. After a long "
    "discussion, the members agreed to extend the opening hours on weekends, to buy more "
    "books for children, and to repair the roof before the winter. The chair thanked the "
    "volunteers who had organised the book sale, which raised enough money to pay for the "
    "new reading lamps in the main hall.",
    "To bake the bread, mix the flour, the salt and the yeast in a large bowl. Add the warm "
    "water slowly and knead the dough for ten minutes until it is smooth. Leave it to rise "
    "for one hour in a warm place, then shape it into a loaf, put it on a tray and bake it "
    "for thirty minutes until the crust is golden brown.",
    "The river starts high in the mountains, where snow melts in the spring. It flows "
    "through narrow valleys and old forests, past small villages and farms, and then across "
    "the wide plain to the city. There it turns slowly to the east and finally reaches the "
    "sea near the harbour, where the fishing boats come home every evening.",
    "Our train leaves the central station at eight in the morning and arrives in the capital "
    "shortly after noon. Passengers should bring their tickets and a valid identity card. "
    "Food and drinks are sold in the restaurant car, and bicycles may be taken on board in "
    "the last carriage if they are booked in advance.",
]
FREE = ["What are three good habits for staying healthy? Answer:",
        "Explain why the sky is blue in simple words. Answer:",
        "Give me a few ideas for a birthday party. Answer:",
        "What should I pack for a weekend trip to the mountains? Answer:"]


def workloads(n: int) -> dict[str, list[str]]:
    grounded = []
    for i in range(n):
        text = TEXTS[i % len(TEXTS)]
        if i % 2 == 0:
            grounded.append(f"Repeat the following text exactly.\n\n{text}\n\nRepeated text:\n")
        else:
            grounded.append(f"Copy the following text, changing nothing but the first word.\n\n"
                            f"{text}\n\nCopied text:\n")
    return {"grounded": grounded, "free": [FREE[i % len(FREE)] for i in range(n)]}


def run_one(engine: Any, prompt: str, max_new: int) -> dict[str, Any]:
    """One request alone; token times from the scheduler's outputs."""
    from engine.runtime.sampling import SamplingParams

    times: list[float] = []
    cpu: list[float] = []  #: process CPU time: steadier than wall time on a shared machine
    state: dict[str, Any] = {"ids": [], "done": False, "last": None}

    def sink(out: Any) -> None:
        if out.token_ids:
            times.append(time.perf_counter())
            cpu.append(time.process_time())
            state["ids"].extend(out.token_ids)
        if out.finished:
            state["done"], state["last"] = True, out

    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True).validate()
    ids = engine.tokenizer.encode(prompt)
    sched = engine.runtime.scheduler
    sched.flush_cache()
    sched.step()  # applies the flush
    reqs = engine.runtime.make_reqs(f"bench-{time.monotonic_ns()}", ids, params, sink)
    sched.submit(reqs)
    while not state["done"]:
        sched.step()
    n = len(state["ids"])
    decode_s = times[-1] - times[0] if len(times) > 1 else float("nan")
    last = state["last"]
    cpu_s = cpu[-1] - cpu[0] if len(cpu) > 1 else float("nan")
    return {"ids": state["ids"], "tps": (n - 1) / decode_s if decode_s > 0 else float("nan"),
            "cpu_tps": (n - 1) / cpu_s if cpu_s > 0 else float("nan"),
            "verify": last.spec_verify_ct, "accepted": last.spec_accepted_tokens, "n": n}


def build(name: str, args: argparse.Namespace) -> Any:
    from engine.runtime.offline import Engine

    base = dict(device=args.device, max_total_tokens=args.max_total_tokens,
                skip_server_warmup=True, **json.loads(args.target_args))
    if name == "plain":
        return Engine(args.model, **base)
    if name == "ngram":
        return Engine(args.model, speculative_algorithm="ngram", **base,
                      **json.loads(args.ngram_args))
    dense = dict(base, quantization="unquant")
    if name == "dense":
        return Engine(args.model, **dense)
    if name == "standalone":
        from engine.models.config import resolve_model_path

        draft = args.draft or resolve_model_path(args.model)
        return Engine(args.model, speculative_algorithm="standalone",
                      speculative_draft_model_path=draft, **dense,
                      **json.loads(args.standalone_args))
    raise SystemExit(f"unknown engine {name}")


BASELINE = {"ngram": "plain", "standalone": "dense"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target model (default: the default model)")
    ap.add_argument("--draft", default=None, help="STANDALONE draft (default: the target's "
                    "own checkpoint, loaded as it is)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--engines", default="plain,ngram,dense,standalone")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    ap.add_argument("--target-args", default="{}", help="JSON: extra engine options")
    ap.add_argument("--ngram-args", default="{}", help="JSON: extra options of the ngram "
                    "engine (e.g. {\"speculative_num_draft_tokens\": 8})")
    ap.add_argument("--standalone-args", default="{}", help="JSON: extra options of the "
                    "standalone engine (e.g. {\"speculative_num_steps\": 5, "
                    "\"speculative_eagle_topk\": 1, \"speculative_num_draft_tokens\": 6})")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    names = args.engines.split(",")
    engines = {n: build(n, args) for n in names}
    work = workloads(args.prompts)
    for e in engines.values():  # warm-up (kernels, caches)
        run_one(e, "Hello, how are you?", 8)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {w: {n: [] for n in names}
                                                            for w in work}
    for w, prompts in work.items():
        for i, prompt in enumerate(prompts):
            order = names if i % 2 == 0 else names[::-1]
            for n in order:
                r = run_one(engines[n], prompt, args.max_new_tokens)
                results[w][n].append(r)
                print(f"{w} {i} {n}: {r['tps']:.1f} tok/s, {r['verify']} verifies, "
                      f"{r['accepted']} accepted", file=sys.stderr, flush=True)
    load = os.getloadavg()
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"# model {args.model or 'default'}, {args.max_new_tokens} new tokens, batch 1, "
          f"greedy, {args.prompts} prompts per workload")
    print("| workload | engine | decode tok/s (median) | speed-up | tok per CPU-s | speed-up "
          "(CPU) | accepted/verify | tokens/verify | same output |")
    print("|---|---|---|---|---|---|---|---|---|")
    table = []
    for w in work:
        for n in names:
            rows = results[w][n]
            tps = statistics.median(r["tps"] for r in rows)
            ctps = statistics.median(r["cpu_tps"] for r in rows)
            base = BASELINE.get(n)
            speed = cspeed = ""
            same = ""
            acc = tpv = ""
            if base in results[w]:
                b = statistics.median(r["tps"] for r in results[w][base])
                speed = f"{tps / b:.2f}x"
                cspeed = f"{ctps / statistics.median(r['cpu_tps'] for r in results[w][base]):.2f}x"
                same = "yes" if all(r["ids"] == q["ids"] for r, q in
                                    zip(rows, results[w][base])) else "NO"
            verify = sum(r["verify"] for r in rows)
            if verify:
                accepted = sum(r["accepted"] for r in rows)
                acc = f"{accepted / verify:.2f}"
                tpv = f"{(accepted + verify) / verify:.2f}"
            print(f"| {w} | {n} | {tps:.1f} | {speed} | {ctps:.1f} | {cspeed} | {acc} | {tpv} "
                  f"| {same} |")
            table.append({"workload": w, "engine": n, "tps": tps, "speedup": speed,
                          "cpu_tps": ctps, "cpu_speedup": cspeed,
                          "accepted_per_verify": acc, "same_output": same})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": load, "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
