"""A 16-bit checkpoint served in float32 on the CPU, its weights kept in 16 bits (the default)
against widened to float32 (``ENGINE_CPU_HALF_WEIGHTS=0``), in the same run: the default model
(its GGUF dequantized, rounded to bfloat16 or half, written as safetensors in that type),
float32 activations, torch_native attention. Per model: the weights' bytes, batch-1 decode
ms/token and batch-8 ms/step (medians of the timed steps after a 64-token prompt), and a
512-token prefill (ms). Interleaved rounds (kept, widened, kept...). The two give the same
logits bit for bit (tests/runtime/test_half_weights.py); only time and memory differ.

    python benchmarks/half_weights_cpu.py [--rounds 3] [--steps 16] [--dtypes bfloat16,float16]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_accuracy as qa  # noqa: E402
from quant_cpu import step_ms  # noqa: E402

from engine.config import ServerConfig  # noqa: E402
from engine.runtime.model_runner import ModelRunner  # noqa: E402
from engine.testing.batches import BatchBuilder  # noqa: E402


def measure(path: str, kept: bool, steps: int) -> dict[str, float]:
    os.environ["ENGINE_CPU_HALF_WEIGHTS"] = "1" if kept else "0"
    runner = ModelRunner(ServerConfig(model_path=path, device="cpu", dtype="float32",
                                      skip_tokenizer_init=True, attention_backend="torch_native",
                                      max_total_tokens=4096, max_running_requests=8))
    out = {"GB": sum(p.numel() * p.element_size()
                     for p in runner.model.parameters()) / 1e9}
    gen = torch.Generator().manual_seed(0)
    for batch in (1, 8):
        out[f"decode{batch}"] = step_ms(runner, batch, steps, gen)
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    row = builder.new_request()
    prompt = torch.randint(0, 32000, (512,), generator=gen).tolist()
    t0 = time.perf_counter()
    runner.forward(builder.extend([(row, prompt)]))
    out["prefill"] = (time.perf_counter() - t0) * 1000
    del runner, builder
    gc.collect()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--dtypes", default="bfloat16,float16")
    args = p.parse_args()
    from safetensors.torch import load_file, save_file

    keys = ("GB", "decode1", "decode8", "prefill")
    results: dict[tuple[str, bool], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dense = os.path.join(tmp, "dense")
        qa.dense_checkpoint(dense)
        state = load_file(os.path.join(dense, "model.safetensors"))
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            path = os.path.join(tmp, name)
            os.makedirs(path)
            for f in os.listdir(dense):
                if f != "model.safetensors":
                    shutil.copy(os.path.join(dense, f), path)
            save_file({k: v.to(dtype) for k, v in state.items()},
                      os.path.join(path, "model.safetensors"))
            for r in range(args.rounds):
                for kept in (True, False):
                    got = measure(path, kept, args.steps)
                    res = results.setdefault((name, kept), {k: [] for k in keys})
                    for k in keys:
                        res[k].append(got[k])
                    print(f"round {r + 1}: {name} {'kept' if kept else 'widened'}: "
                          + ", ".join(f"{k} {got[k]:.2f}" for k in keys), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f}; {torch.get_num_threads()} threads; medians "
          f"over {args.rounds} rounds")
    print("| checkpoint | weights in | weight GB | batch 1 ms/token | batch 8 ms/step "
          "| prefill 512 ms |")
    print("|---|---|---|---|---|---|")
    for (name, kept), res in results.items():
        m = {k: statistics.median(v) for k, v in res.items()}
        print(f"| {name} | {name if kept else 'float32'} | {m['GB']:.3f} | {m['decode1']:.1f} "
              f"| {m['decode8']:.1f} | {m['prefill']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
