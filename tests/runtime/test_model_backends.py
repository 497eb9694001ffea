"""Every attention backend available here gives the default model's torch_native greedy output,
alone and combined through --prefill-attention-backend / --decode-attention-backend."""

from __future__ import annotations

import pytest
import torch

from _default_model import EXACT, default_runner, greedy
from engine.config import ServerConfig
from engine.plugins.registry import Registry
from engine.runtime.model_runner import ModelRunner

STEPS = 8


@pytest.fixture(scope="module")
def prompts():
    tok = default_runner().tokenizer
    return [tok.encode("The capital of France is"), tok.encode("def fibonacci(n):")]


@pytest.fixture(scope="module")
def reference(prompts):
    return greedy(default_runner(), prompts, STEPS)


def available_backends() -> list[str]:
    reg = Registry()
    return [r.name for r in reg.family_records("attention") if r.available]


def run_with(prompts, **choices):
    config = ServerConfig(device="cpu", dtype="float32", max_total_tokens=2048,
                          max_running_requests=4, plugin_options=EXACT, **choices)
    runner = ModelRunner(config)
    try:
        return greedy(runner, prompts, STEPS), runner.attention_backend_names
    finally:
        del runner


@pytest.mark.parametrize("backend", [b for b in available_backends() if b != "torch_native"])
def test_backend_greedy_equals_torch_native(backend, prompts, reference):
    (tokens, logits), names = run_with(prompts, attention_backend=backend)
    assert names == (backend, backend)
    assert tokens == reference[0]
    torch.testing.assert_close(logits, reference[1], atol=1e-3, rtol=1e-3)


def test_prefill_and_decode_backends_combine(prompts, reference):
    others = [b for b in available_backends() if b != "torch_native"]
    if not others:
        pytest.skip("only torch_native is available here")
    (tokens, _), names = run_with(prompts, prefill_attention_backend=others[0],
                                  decode_attention_backend="torch_native")
    assert names == (others[0], "torch_native")
    assert tokens == reference[0]
