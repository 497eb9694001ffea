"""The default model, loaded once per test session (shared by the runtime test modules)."""

from __future__ import annotations

import functools

import torch

from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder


#: the gguf plugin's exact path (float32 activations), which equals transformers token for token
EXACT = {"quantization.gguf": {"gguf_activations": "float32"}}


@functools.lru_cache(maxsize=1)
def default_runner() -> ModelRunner:
    """SmolLM2-135M-Instruct Q4_1 GGUF, float32 on CPU, torch_native attention; the gguf
    plugin's exact path (float32 activations), which equals transformers token for token."""
    config = ServerConfig(device="cpu", dtype="float32", max_total_tokens=8192,
                          attention_backend="torch_native", max_running_requests=8,
                          plugin_options=EXACT)
    return ModelRunner(config)


def greedy(runner: ModelRunner, prompts: list[list[int]], steps: int,
           chunks: int = 1) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy decoding of all prompts as one batch (prefill split into ``chunks`` extend
    batches), then decode batches; returns the new ids and the prompts' last-position logits."""
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size,
                           shuffle=True)
    rows = [builder.new_request() for _ in prompts]
    try:
        done = [0] * len(prompts)
        for c in range(chunks):
            items = []
            for i, (row, ids) in enumerate(zip(rows, prompts)):
                end = len(ids) * (c + 1) // chunks
                items.append((row, ids[done[i]:end]))
                done[i] = end
            logits = runner.forward(builder.extend(items))
        first = logits.clone()
        out = [[int(t)] for t in logits.argmax(-1)]
        for _ in range(steps - 1):
            logits = runner.forward(builder.decode([(r, o[-1]) for r, o in zip(rows, out)]))
            for o, t in zip(out, logits.argmax(-1)):
                o.append(int(t))
        return out, first
    finally:
        for row in rows:
            builder.free(row)
        runner.req_to_token.zero_()
