"""Model-config parsers, the architecture registry, and the loader on tiny checkpoints.

Tiny random Llama (llama3 rope scaling, untied), Qwen2 (qkv bias) and Qwen3 (q/k norm) models
are saved by transformers as safetensors and as ``pytorch_model.bin``; our parser, loader and
decoder must give transformers' logits for a prompt and for a prefix + extend continuation.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.models.config import default_model_path
from engine.models.loader import load_model, unpermute_rows
from engine.assembly import Assembly
from engine.models.registry import ArchitectureRegistry
from engine.plugins.registry import Registry
from engine.runtime.attention import KVPool
from engine.testing.batches import BatchBuilder


@pytest.fixture(scope="module")
def registry():
    return Registry()


def parse(registry, path, parser="auto"):
    config = ServerConfig(model_path=str(path), model_config_parser=parser)
    return Assembly(config, registry).model_config()


def test_hf_parser_reads_the_default_gguf(registry):
    mc = parse(registry, default_model_path(), "hf")
    assert (mc.architecture, mc.num_hidden_layers, mc.hidden_size) == ("LlamaForCausalLM", 30, 576)
    assert (mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim) == (9, 3, 64)
    assert (mc.vocab_size, mc.max_position_embeddings, mc.rope_theta) == (49152, 8192, 100000.0)
    assert mc.tie_word_embeddings and mc.weights_format == "gguf"
    assert mc.eos_token_ids == (2,) and mc.features == frozenset({"gqa"})
    assert parse(registry, default_model_path(), "auto") == mc


def test_mistral_params_json_and_auto_choice(registry, tmp_path):
    params = {"dim": 256, "n_layers": 2, "head_dim": 32, "hidden_dim": 512, "n_heads": 8,
              "n_kv_heads": 2, "norm_eps": 1e-5, "vocab_size": 1000, "rope_theta": 1e6}
    (tmp_path / "params.json").write_text(json.dumps(params))
    for parser in ("mistral", "auto"):
        mc = parse(registry, tmp_path, parser)
        assert mc.architecture == "MistralForCausalLM"
        assert (mc.hidden_size, mc.num_hidden_layers, mc.head_dim) == (256, 2, 32)
        assert (mc.intermediate_size, mc.num_attention_heads, mc.num_key_value_heads) == \
            (512, 8, 2)
        assert (mc.rms_norm_eps, mc.vocab_size, mc.rope_theta) == (1e-5, 1000, 1e6)
    (tmp_path / "config.json").write_text("{}")  # both present: auto picks hf
    with pytest.raises(ConfigError, match="config"):
        parse(registry, tmp_path, "auto")
    with pytest.raises(ConfigError, match="missing field 'n_heads'"):
        os.remove(tmp_path / "config.json")
        (tmp_path / "params.json").write_text("{}")
        parse(registry, tmp_path, "mistral")


def test_wrong_model_path_is_one_config_error(registry, tmp_path):
    with pytest.raises(ConfigError) as exc:
        parse(registry, tmp_path / "nope")
    assert "no such file or directory" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="no config.json"):
        parse(registry, tmp_path)


def test_architecture_registry_lists_known_and_accepts_plugins():
    arch = ArchitectureRegistry()
    with pytest.raises(ConfigError, match="LlamaForCausalLM.*Qwen3ForCausalLM"):
        arch.resolve("GPT2LMHeadModel")
    arch.register("MyLlama", "engine.models.llama:LlamaForCausalLM")
    assert arch.resolve("MyLlama").__name__ == "LlamaForCausalLM"
    with pytest.raises(ValueError, match="already registered"):
        arch.register("MyLlama", "x:Y")
    assert isinstance(arch, ArchitectureRegistry)


def test_unpermute_inverts_the_interleaved_rotary_permutation():
    heads, dim = 3, 8
    w = torch.randn(heads * dim, 5)
    # interleaved order: per head, rows (0, d/2), (1, d/2+1)... stored as pairs
    permuted = w.view(heads, 2, dim // 2, 5).transpose(1, 2).reshape(heads * dim, 5)
    assert torch.equal(unpermute_rows(permuted, heads), w)


# --------------------------------------------------------------------------- tiny checkpoints

def _tiny_hf(kind: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    from transformers import AutoModelForCausalLM

    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                  max_position_embeddings=128, rms_norm_eps=1e-5)
    if kind == "llama3":
        cfg = LlamaConfig(**common, tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16})
    elif kind == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=True)
    else:
        cfg = Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # random biases and norms, so a missed tensor shows
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    return model


def _our_logits(path: str, registry, ids: list[int], split: int) -> torch.Tensor:
    from engine_attention_torch_native.impl import TorchNativeBackend

    config = ServerConfig(model_path=path)
    mc = Assembly(config, registry).model_config()
    model = load_model(mc, config, torch.device("cpu"), torch.float32)
    pool = KVPool(num_layers=mc.num_hidden_layers, num_kv_heads=mc.num_key_value_heads,
                  head_dim=mc.head_dim, num_slots=256, page_size=4, dtype=torch.float32,
                  device=torch.device("cpu"))
    attn = TorchNativeBackend(pool)
    builder = BatchBuilder(torch.zeros((2, 128), dtype=torch.int64), 256, 4, shuffle=True)
    row = builder.new_request()
    out = []
    for chunk in (ids[:split], ids[split:]):
        batch = builder.extend([(row, chunk)], all_logits=True)
        attn.prepare(batch)
        with torch.no_grad():
            hidden = model(batch.input_ids, batch.positions, batch, attn, batch.logits_indices)
            out.append(model.compute_logits(hidden))
    return torch.cat(out)


@pytest.mark.parametrize("kind", ["llama3", "qwen2", "qwen3"])
@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_tiny_checkpoints_match_transformers(kind, fmt, registry, tmp_path):
    model = _tiny_hf(kind)
    model.save_pretrained(tmp_path, safe_serialization=(fmt == "safetensors"))
    if fmt == "pt" and not list(tmp_path.glob("*.bin")):
        for f in tmp_path.glob("*.safetensors"):
            f.unlink()
        torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    mc = parse(registry, tmp_path)
    assert mc.weights_format == fmt
    assert mc.qk_norm == (kind == "qwen3") and mc.attention_bias == (kind == "qwen2")
    ids = [3, 17, 99, 5, 42, 7, 8, 120, 64, 1, 2, 77, 31, 90, 11, 6, 19, 23, 50, 33]
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
    got = _our_logits(str(tmp_path), registry, ids, split=13)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_dummy_weights_are_seeded(registry, tmp_path):
    _tiny_hf("qwen2").config.save_pretrained(tmp_path)
    mc = parse(registry, tmp_path)
    a, b, c = (load_model(mc, ServerConfig(load_format="dummy", random_seed=s),
                          torch.device("cpu"), torch.float32) for s in (1, 1, 2))
    wa, wb, wc = (m.model.layers[0].mlp.down_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.model.norm.weight.eq(1).all()
