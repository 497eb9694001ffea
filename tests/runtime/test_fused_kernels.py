"""The fused decoder kernels (residual add + RMSNorm, per-head q/k norm + RoPE, SiLU-and-mul,
the router's top-k) equal the torch ops they replace in half precision, and the KV row copy
moves exactly the rows asked; the matrix-vector kernels with the norm or SiLU-and-mul in their
loads equal the separate kernels, in a tiny model too: under the Triton interpreter here, on
the GPU where there is one."""

import json
import os
import subprocess
import sys

import pytest
import torch

from child_checks import run_checks

CHECKS = os.path.join(os.path.dirname(__file__), "fused_checks.py")
#: the matrix-vector kernels that make their input in their loads, and a tiny model with them
GEMV_CHECKS = os.path.join(os.path.dirname(__file__), "fused_gemv_checks.py")


def run(device: str, env: dict, checks: str = CHECKS) -> list:
    return run_checks(checks, device, env=env)


def test_fused_kernels_under_the_interpreter():
    assert run("cpu", {"TRITON_INTERPRET": "1"}) == []


@pytest.mark.gpu
def test_fused_kernels_on_the_gpu():
    assert run("cuda", {}) == []


@pytest.mark.parametrize("early", ["1", "0"])
def test_norm_and_silu_inside_the_matrix_vector_product_under_the_interpreter(early):
    """One row: through the kernel that loads its weights before the wait (the default) and
    through the one before (``ENGINE_GEMV_EARLY=0``)."""
    assert run("cpu", {"TRITON_INTERPRET": "1", "ENGINE_GEMV_EARLY": early}, GEMV_CHECKS) == []


@pytest.mark.gpu
def test_norm_and_silu_inside_the_matrix_vector_product_on_the_gpu():
    assert run("cuda", {}, GEMV_CHECKS) == []


def test_float32_and_cpu_tensors_keep_the_torch_ops(monkeypatch):
    from engine.runtime import fused

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not fused.enabled(torch.zeros(2, 2))
    assert not fused.enabled(torch.zeros(2, 2, dtype=torch.bfloat16))


MODEL_CHECK = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from engine.config import ServerConfig
from engine.runtime import fused_triton
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder

calls = []
real = fused_triton.qk_norm_rope_store
fused_triton.qk_norm_rope_store = lambda *a: calls.append(1) or real(*a)
runner = ModelRunner(ServerConfig(model_path=sys.argv[1], load_format="dummy", dtype="float16",
                                  skip_tokenizer_init=True, device="cpu", random_seed=0,
                                  attention_backend="torch_native", max_total_tokens=256,
                                  max_running_requests=4, page_size=4, context_length=64,
                                  kv_cache_dtype=sys.argv[2]))

def run():
    bb = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    prompts = [[5, 9, 17, 3, 11, 2, 8], [7, 1, 30]]
    rows = [bb.new_request() for _ in prompts]
    logits = [runner.forward(bb.extend(list(zip(rows, prompts))))]
    toks = logits[-1].argmax(-1).tolist()
    for _ in range(4):
        logits.append(runner.forward(bb.decode(list(zip(rows, toks)))))
        toks = logits[-1].argmax(-1).tolist()
    return torch.cat(logits).float()

fused_logits = run()
stores = len(calls)
os.environ["ENGINE_DISABLE_FUSED"] = "1"
plain = run()
print(json.dumps({"stores": stores, "after": len(calls),
                  "diff": (fused_logits - plain).abs().max().item(),
                  "same": torch.equal(fused_logits.argmax(-1), plain.argmax(-1))}))
"""


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_a_half_precision_model_stores_kv_in_the_rope_kernel_and_matches_the_torch_ops(tmp_path,
                                                                                       kv):
    """The fused path of a float16 Llama (under the interpreter): q/k norm + RoPE writes K and V
    straight into the pool (an fp8 pool too, quantized in the kernel), and the logits equal
    those of the torch ops with the pool write."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 48,
              "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "torch_dtype": "float16", "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-c", MODEL_CHECK, str(tmp_path), kv],
                          capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items()
                               if k != "ENGINE_DISABLE_FUSED"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["stores"] == 2 * 5 and got["after"] == got["stores"]  # 2 layers x 5 forwards
    assert got["same"] and got["diff"] < 2e-2, got


def test_the_chained_layer_serves_one_dense_row_and_steps_aside_otherwise(monkeypatch):
    """A dense SiLU layer at one half-precision row runs chained (its four weights); more rows,
    a forward hook (LoRA), ``ENGINE_GEMV_CHAIN=0`` or no one-row Triton products: the layer's
    separate kernels. ``stream`` gives the residual stream after either form."""
    from engine.models.config import ModelConfig
    from engine.models.llama import DecoderLayer, SumSq, stream

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ENGINE_GEMV_DENSE_ROWS", "1")
    monkeypatch.delenv("ENGINE_GEMV_CHAIN", raising=False)
    cfg = ModelConfig(architecture="LlamaForCausalLM", hidden_size=64, intermediate_size=96,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, vocab_size=8, max_position_embeddings=64,
                      rope_theta=10000.0)
    layer = DecoderLayer(cfg, 0, torch.float16, lambda name: None)
    one, two = torch.zeros(1, 64, dtype=torch.float16), torch.zeros(2, 64, dtype=torch.float16)
    weights = layer._chain_weights(one)
    assert weights is not None and [tuple(w.shape) for w in weights] == \
        [(128, 64), (64, 64), (192, 64), (64, 96)]
    assert layer._chain_weights(two) is None
    assert layer._chain_weights(one.float()) is None
    monkeypatch.setenv("ENGINE_GEMV_CHAIN", "0")
    assert layer._chain_weights(one) is None
    monkeypatch.delenv("ENGINE_GEMV_CHAIN")
    hook = layer.self_attn.o_proj.register_forward_hook(lambda *a: None)
    assert layer._chain_weights(one) is None
    hook.remove()
    monkeypatch.setenv("ENGINE_GEMV_DENSE_ROWS", "0")
    assert layer._chain_weights(one) is None
    h, r = torch.ones(1, 4), torch.full((1, 4), 2.0)
    assert torch.equal(stream(h, r), h + r) and stream(h, None) is h
    assert stream(h, SumSq(torch.zeros(3))) is h
