"""The gguf plugin's 8-bit products from the panel form (16 rows' codes interleaved, made at
load) against the row-by-row kernels on the same blocks, then the default model with and
without the panel form (``ENGINE_GGUF_PANELS=0``), same run, alternating.

Kernels: random valid blocks; Q4_0 / Q4_1 / Q8_0 at the default model's shapes (SmolLM2-135M:
q/k/v 960x576, gate/up 3072x576, down 576x1536), Q4_K / Q5_K / Q6_K at widths that are multiples
of 256 (576x1536, 1536x768) and at Llama-like 2048x2048 / 5632x2048; 1, 8, 64 and 512 rows of
activations. Each cell is the median over ``--rounds`` interleaved rounds (rows, panels, rows,
...); GOP/s counts 2 m n k.

Model (``--model``): the default model through ``ModelRunner`` in a fresh process per setting
(the switch is read at load), settings alternating over ``--model-rounds``: a 512-token prefill
and decode steps at 1, 8 and 16 requests (the loop of benchmarks/decode_cpu.py).

    python benchmarks/gguf_panels_cpu.py [--rounds 5] [--model] [--model-rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gguf_kquants_cpu import random_blocks  # noqa: E402

SHAPES = {"Q4_0": [(960, 576), (3072, 576), (576, 1536)],
          "Q4_1": [(960, 576), (3072, 576), (576, 1536)],
          "Q8_0": [(960, 576), (3072, 576), (576, 1536)],
          "Q4_K": [(576, 1536), (1536, 768), (2048, 2048), (5632, 2048)],
          "Q5_K": [(576, 1536), (2048, 2048)],
          "Q6_K": [(576, 1536), (2048, 2048), (5632, 2048)]}
ROWS = (1, 8, 64, 512)


def kernels_table(rounds: int) -> None:
    from engine_quant_gguf import kernels

    if not kernels.panel_path():
        print("no panel kernels on this CPU (they need AVX512-VNNI)")
        return
    ids = {**kernels.QTYPES, **kernels.KQTYPES}
    rng = np.random.default_rng(0)
    print("| type | weight | rows | row kernel ms | panel form ms | speed-up | panel GOP/s |")
    print("|---|---|---|---|---|---|---|")
    for name, shapes in SHAPES.items():
        qid = ids[name]
        for n, k in shapes:
            blocks = random_blocks(name, n, k, rng)
            panels = kernels.panelize(qid, blocks, n, k)
            for m in ROWS:
                x = torch.randn(m, k)
                calls = max(1, 2000 // (m * max(1, n * k // 1_000_000)))
                times: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(rounds):
                    for form in (False, True):
                        data = panels if form else blocks
                        kernels.matmul_q8(qid, data, n, x, panels=form)
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            kernels.matmul_q8(qid, data, n, x, panels=form)
                        times[form].append((time.perf_counter() - t0) / calls)
                a, b = statistics.median(times[False]), statistics.median(times[True])
                print(f"| {name} | {n}x{k} | {m} | {a * 1e3:.3f} | {b * 1e3:.3f} | "
                      f"{a / b:.2f}x | {2 * m * n * k / b / 1e9:.0f} |", flush=True)


CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from decode_cpu import ours
from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder
r = ModelRunner(ServerConfig(device="cpu", dtype="float32", max_total_tokens=8192,
                             attention_backend="torch_native"))
bb = BatchBuilder(r.req_to_token, r.pool.num_slots, r.page_size)
prompt = list(range(1000, 1512))
times = []
for _ in range(3):
    row = bb.new_request()
    t0 = time.perf_counter()
    r.forward(bb.extend([(row, prompt)]))
    times.append(time.perf_counter() - t0)
    bb.free(row)
out = {"prefill": min(times) * 1000}
short = r.tokenizer.encode("The history of the city begins with a small settlement. " * 20)[:64]
for batch in (1, 8, 16):
    out[batch] = min(ours(short, batch, 32, r) for _ in range(2))
print(json.dumps(out))
"""


def model_table(rounds: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    runs: dict[str, list[dict]] = {"1": [], "0": []}
    for _ in range(rounds):
        for setting in ("1", "0"):
            env = dict(os.environ, ENGINE_GGUF_PANELS=setting)
            out = subprocess.run([sys.executable, "-c", CHILD, here], env=env, check=True,
                                 capture_output=True, text=True).stdout
            runs[setting].append(json.loads(out.strip().splitlines()[-1]))
    print(f"\nthe default model (SmolLM2-135M-Instruct Q4_1), {rounds} rounds, medians; "
          f"load {os.getloadavg()[0]:.2f}")
    print("| measure | row kernels (ENGINE_GGUF_PANELS=0) | panel form | speed-up |")
    print("|---|---|---|---|")
    for key, label in (("prefill", "512-token prefill, ms"), ("1", "decode, batch 1, ms/step"),
                       ("8", "decode, batch 8, ms/step"), ("16", "decode, batch 16, ms/step")):
        a = statistics.median(r[key] for r in runs["0"])
        b = statistics.median(r[key] for r in runs["1"])
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", action="store_true", help="also the default model")
    ap.add_argument("--model-rounds", type=int, default=2)
    ap.add_argument("--no-kernels", action="store_true")
    args = ap.parse_args()
    print(f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    if not args.no_kernels:
        kernels_table(args.rounds)
    if args.model:
        model_table(args.model_rounds)


if __name__ == "__main__":
    main()
