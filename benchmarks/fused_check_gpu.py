"""The fused decoder kernels in a whole model on a GPU: prefill logits of a dummy Llama-3-8B and
Qwen3-30B-A3B shape (a few layers) with the fused kernels and with the torch ops
(``ENGINE_DISABLE_FUSED=1``, read per call), same weights, same batch; then the kernel-level
checks of tests/runtime/fused_checks.py with their failures printed in full.

    python3 benchmarks/fused_check_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def compare(model_dir: str, layers: int) -> str:
    from engine.config import ServerConfig
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    cfg = ServerConfig(model_path=model_dir, load_format="dummy", dtype="bfloat16",
                       skip_tokenizer_init=True, attention_backend="triton", page_size=16,
                       disable_cuda_graph=True, max_total_tokens=20_000, max_running_requests=8,
                       context_length=2048, random_seed=0,
                       json_model_override_args=json.dumps({"num_hidden_layers": layers}))
    runner = ModelRunner(cfg)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 32000, (n,), generator=gen).tolist() for n in (17, 64, 100)]
    out = []
    for disable in ("0", "1"):
        os.environ["ENGINE_DISABLE_FUSED"] = disable
        bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        rows = [bb.new_request() for _ in prompts]
        out.append(runner.forward(bb.extend(list(zip(rows, prompts)))).float())
        for r in rows:
            bb.free(r)
    os.environ.pop("ENGINE_DISABLE_FUSED")
    diff = (out[0] - out[1]).abs().max().item()
    same = (out[0].argmax(-1) == out[1].argmax(-1)).tolist()
    del runner
    torch.cuda.empty_cache()
    return f"max |fused - torch ops| {diff:.4f} (logit scale {out[1].abs().max():.2f}); " \
           f"same argmax per prompt {same}"


def main() -> None:
    for name, layers in (("llama3-8b-dummy", 32), ("qwen3-30b-a3b-dummy", 8)):
        print(f"{name} ({layers} layers): {compare(str(ROOT / 'tests' / 'data' / name), layers)}",
              flush=True)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "runtime" / "fused_checks.py"),
                           "cuda"], capture_output=True, text=True)
    print("kernel checks:", proc.stdout.strip()[-3000:] or proc.stderr[-2000:])


if __name__ == "__main__":
    main()
