"""PEFT LoRA adapters written at test time (random weights, PEFT's file layout)."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection of a Llama-style ``config.json`` dict."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads",
                                                    cfg["num_attention_heads"])
    d = cfg.get("head_dim") or h // heads
    return {"q_proj": (heads * d, h), "k_proj": (kv * d, h), "v_proj": (kv * d, h),
            "o_proj": (h, heads * d), "gate_proj": (inter, h), "up_proj": (inter, h),
            "down_proj": (h, inter)}


def write_adapter(path: str, cfg: dict[str, Any], *, rank: int = 4, alpha: float = 8.0,
                  targets: tuple[str, ...] = ATTENTION + MLP, seed: int = 0,
                  scale: float = 0.1, extra_config: dict[str, Any] | None = None) -> str:
    """A PEFT adapter folder for the model of ``cfg`` (a ``config.json`` dict): random
    ``lora_A`` / ``lora_B`` of ``targets`` in every layer, keys as PEFT saves them."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    dims = shapes(cfg)
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for name in targets:
            out_f, in_f = dims[name]
            group = "self_attn" if name in ATTENTION else "mlp"
            key = f"base_model.model.model.layers.{i}.{group}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) * scale
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * scale
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
              "target_modules": list(targets), "bias": "none", "use_rslora": False,
              "task_type": "CAUSAL_LM", **(extra_config or {})}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return path
