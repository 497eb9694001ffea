"""Tiny random MoE checkpoints written by transformers (``save_pretrained``) at test time."""

from __future__ import annotations

import functools
import os
import tempfile

import torch

COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.15,
              tie_word_embeddings=False)

#: architecture -> (config class name, model class name, routed-expert fields)
ARCHS = {
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(
        intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, head_dim=16)),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", dict(
        intermediate_size=80, moe_intermediate_size=32, num_experts=6, num_experts_per_tok=3,
        norm_topk_prob=False, shared_expert_intermediate_size=48, mlp_only_layers=[1])),
    "MixtralForCausalLM": ("MixtralConfig", dict(
        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)),
    "OlmoeForCausalLM": ("OlmoeConfig", dict(
        intermediate_size=32, num_experts=8, num_experts_per_tok=4, norm_topk_prob=False,
        clip_qkv=3.0, eos_token_id=1, pad_token_id=0, bos_token_id=None)),
}


def hf_model(arch: str, seed: int = 0) -> torch.nn.Module:
    import transformers

    cfg_name, fields = ARCHS[arch]
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **fields})
    torch.manual_seed(seed)
    return getattr(transformers, arch)(cfg).eval()


@functools.lru_cache(maxsize=None)
def checkpoint(arch: str) -> str:
    """A directory with config.json + model.safetensors (per-expert tensor names)."""
    path = tempfile.mkdtemp(prefix=f"moe-{arch}-")
    hf_model(arch).save_pretrained(path)
    return path


def stacked_checkpoint(arch: str) -> str:
    """The same weights with the experts stacked (``mlp.experts.gate_up_proj`` [E, 2I, H])."""
    from safetensors.torch import save_file

    src = checkpoint(arch)
    path = tempfile.mkdtemp(prefix=f"moe-stacked-{arch}-")
    model = hf_model(arch)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state), "not a stacked layout"
    save_file(state, os.path.join(path, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as fh, \
            open(os.path.join(path, "config.json"), "w") as out:
        out.write(fh.read())
    return path
