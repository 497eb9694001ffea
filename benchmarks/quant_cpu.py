"""CPU decode speed of each quantization format against the same model served dense: the
default model (its GGUF dequantized to float32) written in each checkpoint format as
benchmarks/quant_accuracy.py writes it, served through its ``--quantization`` choice (float32,
torch_native attention), batch-1 decode ms/token and batch-8 ms/step (medians over the timed
steps after a 64-token prompt), next to the dense float32 checkpoint in the same run
(interleaved rounds: dense, then each format, then dense again...). The bar the quantization
plugins are held to on CPU: no format slower than dense.

    python benchmarks/quant_cpu.py [--rounds 2] [--steps 24] [--per-op] [scheme ...]

``--per-op`` also times each model with ``ENGINE_CPU_DECODE_PLAN=0`` (every layer's operations
called from Python, not the whole-forward decode plan), in the same rounds.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_accuracy as qa  # noqa: E402

from engine.config import ServerConfig  # noqa: E402
from engine.runtime.model_runner import ModelRunner  # noqa: E402
from engine.testing import quant as tq  # noqa: E402
from engine.testing.batches import BatchBuilder  # noqa: E402


def decode_ms(path: str, batch: int, steps: int, per_op: bool = False) -> float:
    os.environ["ENGINE_CPU_DECODE_PLAN"] = "0" if per_op else "1"  # (read as the model is made)
    runner = ModelRunner(ServerConfig(model_path=path, device="cpu", dtype="float32",
                                      skip_tokenizer_init=True, attention_backend="torch_native",
                                      max_total_tokens=4096, max_running_requests=8))
    ms = step_ms(runner, batch, steps, torch.Generator().manual_seed(batch))
    del runner
    gc.collect()
    return ms


def step_ms(runner: ModelRunner, batch: int, steps: int, gen: torch.Generator) -> float:
    """Median ms of a decode step of ``batch`` requests after random 64-token prompts (the
    first two steps not counted); the requests are freed after."""
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    rows = [builder.new_request() for _ in range(batch)]
    prompts = [torch.randint(0, 32000, (64,), generator=gen).tolist() for _ in rows]
    tokens = runner.forward(builder.extend(list(zip(rows, prompts)))).argmax(-1).tolist()
    times = []
    for _ in range(steps + 2):
        t0 = time.perf_counter()
        tokens = runner.forward(builder.decode(list(zip(rows, tokens)))).argmax(-1).tolist()
        times.append(time.perf_counter() - t0)
    for r in rows:
        builder.free(r)
    return statistics.median(times[2:]) * 1000


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("schemes", nargs="*")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--per-op", action="store_true",
                   help="also time each model without the decode plan")
    args = p.parse_args()
    names = args.schemes or list(qa.SCHEMES)
    with tempfile.TemporaryDirectory() as tmp:
        dense = os.path.join(tmp, "dense")
        qa.dense_checkpoint(dense)
        paths = {"dense float32 (unquant)": dense}
        for name in names:
            qdir = os.path.join(tmp, name)
            tq.write_checkpoint(dense, qdir, name, input_amax=qa.INPUT_AMAX, **qa.SCHEMES[name])
            paths[f"{name} ({tq.CHOICE[name]})"] = qdir
        if args.per_op:
            paths = {k: v for label, path in paths.items()
                     for k, v in ((label, path), (f"{label}, per-op", path))}
        results: dict[str, dict[int, list[float]]] = {k: {1: [], 8: []} for k in paths}
        for r in range(args.rounds):
            for label, path in paths.items():
                for batch in (1, 8):
                    results[label][batch].append(
                        decode_ms(path, batch, args.steps, label.endswith(", per-op")))
                print(f"round {r + 1}: {label}: {results[label][1][-1]:.1f} ms/token, "
                      f"{results[label][8][-1]:.1f} ms/step at 8", flush=True)
    base = {b: statistics.median(results["dense float32 (unquant)"][b]) for b in (1, 8)}
    print(f"\nload average {os.getloadavg()[0]:.2f}; {torch.get_num_threads()} threads; medians "
          f"over {args.rounds} rounds")
    print("| format (choice) | batch 1 ms/token | vs dense | batch 8 ms/step | vs dense |")
    print("|---|---|---|---|---|")
    for label in paths:
        m1, m8 = (statistics.median(results[label][b]) for b in (1, 8))
        print(f"| {label} | {m1:.1f} | {m1 / base[1]:.2f}x | {m8:.1f} | {m8 / base[8]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
