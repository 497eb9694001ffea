"""Low-rank adapters (LoRA) on the target's linear layers, from a PEFT checkpoint.

A PEFT adapter folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``use_rslora``,
``target_modules``...) and ``adapter_model.safetensors`` (or ``adapter_model.bin``) with, per
adapted module ``M``, ``....M.lora_A.weight`` [r, in] and ``....M.lora_B.weight`` [out, r]. An
adapted layer computes ``y = x W^T + s * (x A^T) B^T`` with ``s = alpha / r`` (``alpha /
sqrt(r)`` under rsLoRA).

The engine fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``; an adapter of the
separate projections is fused the same way: the shards' ``A`` stacked ([shards * r, in]) and
their ``B`` placed block-diagonally ([out, shards * r]); a shard the adapter leaves alone has
zero blocks.

:meth:`LoraAdapter.applied` adds the deltas, for the duration of a ``with`` block, to the rows
of every forward that a row index lists (forward hooks on the adapted layers: the
model's code is unchanged, and forwards outside the block run without them).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from typing import Any, Iterator

import torch
from torch import nn

from engine.errors import ConfigError

#: PEFT module names -> (the engine's fused layer, shard index); others map to themselves
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
SUPPORTED = set(FUSED) | {"qkv_proj", "gate_up_proj", "o_proj", "down_proj"}
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<ab>lora_[AB])"
                  r"(?:\.[A-Za-z0-9_]+)?\.weight$")


class LoraAdapter:
    """One adapter's stacked ``A`` and block-diagonal ``B`` per adapted layer of a model."""

    def __init__(self, layers: dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]],
                 scaling: float, rank: int, path: str) -> None:
        #: module name -> (the Linear, A [k, in], B [out, k] already scaled)
        self.layers = layers
        self.scaling, self.rank, self.path = scaling, rank, path

    @classmethod
    def load(cls, path: str, model: nn.Module, *, device: Any, dtype: torch.dtype
             ) -> "LoraAdapter":
        """Read the PEFT adapter at ``path`` for ``model`` (ConfigError naming the problem:
        missing files, options this engine does not apply, modules or shapes the model does
        not have)."""
        cfg = _read_config(path)
        tensors = _read_tensors(path)
        rank = int(cfg.get("r") or 0)
        if rank < 1:
            raise ConfigError(f"LoRA adapter {path}: r={cfg.get('r')!r} (must be at least 1)")
        alpha = float(cfg.get("lora_alpha") or rank)
        scaling = alpha / (math.sqrt(rank) if cfg.get("use_rslora") else rank)
        for key, what in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out weights")):
            if cfg.get(key):
                raise ConfigError(f"LoRA adapter {path}: {what} are not applied by this engine")
        for key in ("rank_pattern", "alpha_pattern"):
            if cfg.get(key):
                raise ConfigError(f"LoRA adapter {path}: per-module ranks or alphas ({key}) are "
                                  "not applied by this engine")
        if cfg.get("modules_to_save"):
            raise ConfigError(f"LoRA adapter {path}: modules_to_save "
                              f"{cfg['modules_to_save']} (full weights) are not applied")
        if cfg.get("bias", "none") != "none":
            raise ConfigError(f"LoRA adapter {path}: bias={cfg['bias']!r}; only 'none' is "
                              "applied")
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            m = _KEY.match(key)
            if m is None:
                raise ConfigError(f"LoRA adapter {path}: tensor {key!r} is not a lora_A/lora_B "
                                  "weight (embedding or head adapters are not applied)")
            pairs.setdefault(m["module"], {})[m["ab"]] = value
        modules = dict(model.named_modules())
        grouped: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        for name, ab in sorted(pairs.items()):
            if set(ab) != {"lora_A", "lora_B"}:
                raise ConfigError(f"LoRA adapter {path}: {name} has {sorted(ab)} only")
            parent, _, leaf = name.rpartition(".")
            if leaf not in SUPPORTED:
                raise ConfigError(f"LoRA adapter {path}: module {leaf!r} ({name}) is not "
                                  f"adapted by this engine (it adapts {sorted(SUPPORTED)})")
            fused, shard = FUSED.get(leaf, (leaf, None))
            target = f"{parent}.{fused}" if parent else fused
            if target not in modules:
                raise ConfigError(f"LoRA adapter {path}: the model has no {target} (for {name})")
            a, b = ab["lora_A"], ab["lora_B"]
            if a.shape[0] != rank or b.shape[1] != rank:
                raise ConfigError(f"LoRA adapter {path}: {name} has rank {a.shape[0]}/"
                                  f"{b.shape[1]}, the config says r={rank}")
            grouped.setdefault(target, {})[-1 if shard is None else shard] = (a, b)
        if not grouped:
            raise ConfigError(f"LoRA adapter {path}: no lora_A/lora_B weights")
        layers: dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]] = {}
        for target, shards in grouped.items():
            layer = modules[target]
            in_f, out_f = layer.in_features, layer.out_features
            widths = [out_f] if -1 in shards else list(getattr(layer, "shards", None) or ())
            if -1 in shards and len(shards) > 1:
                raise ConfigError(f"LoRA adapter {path}: {target} is adapted both fused and "
                                  "per projection")
            if not widths or sum(widths) != out_f:
                raise ConfigError(f"LoRA adapter {path}: {target}'s shards are unknown")
            order = sorted(shards)
            a_cat = torch.zeros((rank * len(order), in_f), dtype=torch.float32)
            b_cat = torch.zeros((out_f, rank * len(order)), dtype=torch.float32)
            offsets = [0]
            for w in widths:
                offsets.append(offsets[-1] + w)
            for k, s in enumerate(order):
                a, b = shards[s]
                lo, hi = (0, out_f) if s == -1 else (offsets[s], offsets[s + 1])
                if tuple(a.shape) != (rank, in_f) or tuple(b.shape) != (hi - lo, rank):
                    raise ConfigError(
                        f"LoRA adapter {path}: {target} shard {s}: A {tuple(a.shape)}, "
                        f"B {tuple(b.shape)}; the model needs A ({rank}, {in_f}), "
                        f"B ({hi - lo}, {rank})")
                a_cat[k * rank:(k + 1) * rank] = a.float()
                b_cat[lo:hi, k * rank:(k + 1) * rank] = b.float() * scaling
            layers[target] = (layer, a_cat.to(device=device, dtype=dtype),
                              b_cat.to(device=device, dtype=dtype))
        return cls(layers, scaling, rank, path)

    @classmethod
    def random(cls, model: nn.Module, *, rank: int, seed: int, device: Any,
               dtype: torch.dtype, targets: tuple[str, ...] = ("qkv_proj", "o_proj",
                                                               "gate_up_proj", "down_proj")
               ) -> "LoraAdapter":
        """Random weights of ``rank`` on every layer named in ``targets`` (``A`` with unit
        rows, ``B`` small: each layer's output moves by a few percent)."""
        gen = torch.Generator().manual_seed(seed)
        layers: dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]] = {}
        for name, module in model.named_modules():
            if name.rpartition(".")[2] not in targets or not hasattr(module, "in_features"):
                continue
            a = torch.randn(rank, module.in_features, generator=gen) / math.sqrt(
                module.in_features)
            b = torch.randn(module.out_features, rank, generator=gen) * (0.05 / math.sqrt(rank))
            layers[name] = (module, a.to(device=device, dtype=dtype),
                            b.to(device=device, dtype=dtype))
        if not layers:
            raise ConfigError(f"a random LoRA adapter: the model has none of {targets}")
        return cls(layers, 1.0, rank, "(random)")

    @contextlib.contextmanager
    def applied(self, index: torch.Tensor | None = None) -> Iterator[None]:
        """Inside the block, every adapted layer adds its delta to the rows of its input whose
        numbers ``index`` lists (a long tensor on the forward's device: no host sync, so a
        CUDA graph can capture it); to every row when ``None``."""
        handles = []
        idx = index

        def hook(a: torch.Tensor, b: torch.Tensor):
            def add(_module: nn.Module, inputs: tuple[torch.Tensor, ...],
                    out: torch.Tensor) -> torch.Tensor:
                x = inputs[0]
                if idx is None:
                    return out + (x.to(a.dtype) @ a.T @ b.T).to(out.dtype)
                delta = (x.index_select(0, idx).to(a.dtype) @ a.T @ b.T).to(out.dtype)
                return out.index_add(0, idx, delta)
            return add

        try:
            for layer, a, b in self.layers.values():
                handles.append(layer.register_forward_hook(hook(a, b)))
            yield
        finally:
            for h in handles:
                h.remove()


def _read_config(path: str) -> dict[str, Any]:
    if not os.path.isdir(path):
        raise ConfigError(f"LoRA adapter {path}: not a folder")
    file = os.path.join(path, "adapter_config.json")
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"LoRA adapter {path}: no adapter_config.json") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"LoRA adapter {path}: adapter_config.json: {exc}") from None
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"LoRA adapter {path}: peft_type {cfg['peft_type']!r} (LORA only)")
    return cfg


def _read_tensors(path: str) -> dict[str, torch.Tensor]:
    st = os.path.join(path, "adapter_model.safetensors")
    try:
        if os.path.exists(st):
            from safetensors.torch import load_file

            return load_file(st)
        pt = os.path.join(path, "adapter_model.bin")
        if os.path.exists(pt):
            return torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a corrupt file is a start-up error
        raise ConfigError(f"LoRA adapter {path}: cannot read its weights: {exc}") from None
    raise ConfigError(f"LoRA adapter {path}: no adapter_model.safetensors or "
                      "adapter_model.bin")
