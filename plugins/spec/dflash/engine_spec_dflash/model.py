"""The DFlash draft head in plain PyTorch, and its checkpoint loader.

A DFlash draft (``DFlashDraftModel``, Qwen3-style layers) has no embedding and no LM head: it
reads the target's. For a request whose verified tokens are ``0 .. n - 1`` and whose last token
``t`` (position ``n``) is not verified yet, one forward drafts ``block - 1`` tokens:

* the block is ``t`` followed by ``block - 1`` mask tokens, embedded by the target, at
  positions ``n .. n + block - 1``;
* the context is the target's features of the verified tokens: the outputs of the layers in
  ``target_layer_ids`` concatenated (transformers' ``hidden_states[id + 1]``: for the last layer
  the final normed state), through ``fc`` (no bias) and ``hidden_norm``: one vector per token,
  the same for every draft layer;
* each layer projects the context and the (``input_layernorm``-ed) block to keys and values with
  the same ``k_proj``/``v_proj``, per-head ``q_norm``/``k_norm`` and RoPE at their positions;
  the block's queries attend to every context key and every block key (no causal mask);
  residual, ``post_attention_layernorm``, SiLU-gated MLP, residual;
* ``norm``, the target's LM head on block rows ``1 ..``: the drafts, greedy.

The context keys and values of a layer depend only on the verified tokens, so they are kept per
request (a contiguous cache per layer) and extended by the newly verified tokens each step; the
block's own keys are never kept.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.api import ConfigError
from engine.api.speculative import RowCache, rope


@dataclass
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    input_embedding_scale: float = 1.0
    #: the whole config.json (variants read their own fields from it)
    raw: dict = field(default_factory=dict, repr=False)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


class Layer(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        h, d = c.hidden_size, c.head_dim
        self.c = c
        self.q_proj = nn.Linear(h, c.num_heads * d, bias=c.attention_bias)
        self.k_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * d, h, bias=c.attention_bias)
        self.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        for name, size in (("q_norm", d), ("k_norm", d), ("input_layernorm", h),
                           ("post_attention_layernorm", h)):
            self.register_parameter(name, nn.Parameter(torch.ones(size), requires_grad=False))

    def _kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, t = self.c, x.shape[0]
        k = _rms(self.k_proj(x).view(t, c.num_kv_heads, c.head_dim), self.k_norm, c.rms_norm_eps)
        return rope(k, positions, c.rope_theta), self.v_proj(x).view(t, c.num_kv_heads,
                                                                        c.head_dim)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor,
                pos: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        """The block ``x`` [T, H] at ``pos`` through the layer; ``cache`` ([k, v] of the
        context so far) grows by the new context ``ctx`` [C, H] at ``ctx_pos``."""
        c, t = self.c, x.shape[0]
        h = _rms(x, self.input_layernorm, c.rms_norm_eps)
        k_ctx, v_ctx = self._kv(ctx, ctx_pos)
        cache[0] = torch.cat([cache[0], k_ctx]) if cache[0].numel() else k_ctx
        cache[1] = torch.cat([cache[1], v_ctx]) if cache[1].numel() else v_ctx
        k_blk, v_blk = self._kv(h, pos)
        q = _rms(self.q_proj(h).view(t, c.num_heads, c.head_dim), self.q_norm, c.rms_norm_eps)
        q = rope(q, pos, c.rope_theta)
        ratio = c.num_heads // c.num_kv_heads
        keys = torch.cat([cache[0], k_blk]).repeat_interleave(ratio, dim=1).transpose(0, 1)
        vals = torch.cat([cache[1], v_blk]).repeat_interleave(ratio, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, vals,
                                             scale=c.head_dim ** -0.5)
        x = x + self.o_proj(out.transpose(0, 1).reshape(t, -1))
        h = _rms(x, self.post_attention_layernorm, c.rms_norm_eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


    def forward_rows(self, x: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor,
                     ctx_rows: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
                     cache: RowCache, layer: int, span: int) -> torch.Tensor:
        """Every request's block at once: ``x`` [B, W, H] at ``pos`` [B, W]; the new context
        ``ctx`` [B, C, H] at ``ctx_pos`` goes into row ``ctx_rows`` [B, C] of ``cache`` (the
        scratch row for padding), the block's keys into its request's row ``rows`` [B] at its
        positions; the block then attends to its row up to its last position."""
        c = self.c
        b, w = x.shape[:2]
        kb, vb = cache.k[layer], cache.v[layer]
        k_ctx, v_ctx = self._kv(ctx.reshape(-1, ctx.shape[-1]), ctx_pos.reshape(-1))
        kb.index_put_((ctx_rows.reshape(-1), ctx_pos.reshape(-1)), k_ctx)
        vb.index_put_((ctx_rows.reshape(-1), ctx_pos.reshape(-1)), v_ctx)
        h = _rms(x, self.input_layernorm, c.rms_norm_eps)
        flat = pos.reshape(-1)
        k_blk, v_blk = self._kv(h.reshape(b * w, -1), flat)
        block_rows = rows[:, None].expand(b, w).reshape(-1)
        kb.index_put_((block_rows, flat), k_blk)
        vb.index_put_((block_rows, flat), v_blk)
        q = _rms(self.q_proj(h).view(b * w, c.num_heads, c.head_dim), self.q_norm,
                 c.rms_norm_eps)
        q = rope(q, flat, c.rope_theta).view(b, w, c.num_heads, c.head_dim).transpose(1, 2)
        ratio = c.num_heads // c.num_kv_heads
        keys = kb[rows, :span].repeat_interleave(ratio, dim=2).transpose(1, 2)
        vals = vb[rows, :span].repeat_interleave(ratio, dim=2).transpose(1, 2)
        end = pos[:, -1:] + 1  # the block sees its whole row up to its last position
        mask = torch.arange(span, device=x.device)[None, :] < end  # [B, span]
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask[:, None, None],
                                             scale=c.head_dim ** -0.5)
        x = x + self.o_proj(out.transpose(1, 2).reshape(b, w, -1))
        h = _rms(x, self.post_attention_layernorm, c.rms_norm_eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DFlashHead(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.cfg = c
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(c.hidden_size), requires_grad=False)
        self.norm = nn.Parameter(torch.ones(c.hidden_size), requires_grad=False)

    def forward_rows(self, block: torch.Tensor, feats: torch.Tensor, ctx_pos: torch.Tensor,
                     ctx_rows: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
                     cache: RowCache, span: int) -> torch.Tensor:
        """Every request's block at once (:meth:`Layer.forward_rows`): final hidden states
        [B, W, H]; ``feats`` [B, C, F] the target's features of each request's newly verified
        tokens (padding rows written to the scratch row)."""
        eps = self.cfg.rms_norm_eps
        ctx = _rms(self.fc(feats), self.hidden_norm, eps)
        x = block
        for i, layer in enumerate(self.layers):
            x = layer.forward_rows(x, ctx, ctx_pos, ctx_rows, pos, rows, cache, i, span)
        return _rms(x, self.norm, eps)

    def forward(self, block: torch.Tensor, feats: torch.Tensor, ctx_pos: torch.Tensor,
                pos: torch.Tensor, caches: list[list[torch.Tensor]]) -> torch.Tensor:
        """One request's block: final hidden states [T, H] (see the module docstring);
        ``feats`` [C, F] are the target's features of the newly verified tokens, at ``ctx_pos``
        (the reference the batched :meth:`forward_rows` is tested against)."""
        eps = self.cfg.rms_norm_eps
        ctx = _rms(self.fc(feats), self.hidden_norm, eps)
        x = block
        for layer, cache in zip(self.layers, caches):
            x = layer(x, ctx, ctx_pos, pos, cache)
        return _rms(x, self.norm, eps)


def _value(raw: dict, name: str, default: Any = None) -> Any:
    return (raw.get("dflash_config") or {}).get(name, raw.get(name, default))


def _refuse(path: str, what: str) -> ConfigError:
    return ConfigError(f"--speculative-draft-model-path {path}: {what}")


def read_raw(path: str) -> dict:
    """``path``/config.json as a dict (ConfigError when there is none)."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise _refuse(path, "no config.json")
    with open(cfg_file) as f:
        return json.load(f)


def read_config(path: str, target: Any) -> DFlashConfig:
    """The head's config from ``path``/config.json, checked against the target."""
    return config_from_raw(read_raw(path), path, target)


def config_from_raw(raw: dict, path: str, target: Any) -> DFlashConfig:
    """The head's config from a config.json dict, checked against the target."""
    ids = _value(raw, "target_layer_ids")
    mask = _value(raw, "mask_token_id")
    if not ids:
        raise _refuse(path, "no dflash_config.target_layer_ids (the target layers it reads)")
    if mask is None:
        raise _refuse(path, "no dflash_config.mask_token_id")
    if any(_value(raw, k) is not None for k in ("conv_kernel_size", "selector_rank")):
        raise _refuse(path, "a DFlash2 checkpoint (dynamic convolutions and a candidate "
                      "selector) is not built here; DFlash checkpoints are")
    scaling = raw.get("rope_scaling")
    if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        raise _refuse(path, f"rope_scaling {scaling.get('rope_type') or scaling.get('type')} "
                      "is not built for DFlash heads (plain RoPE only)")
    if "sliding_attention" in (raw.get("layer_types") or []) or raw.get("is_causal"):
        raise _refuse(path, "causal or sliding-window DFlash layers are not built here")
    if raw.get("final_logit_softcapping") or _value(raw, "output_multiplier", 1.0) != 1.0:
        raise _refuse(path, "a logit multiplier or soft cap is not built for DFlash heads")
    h, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    ids = [int(i) for i in ids]
    if h != target.hidden_size:
        raise _refuse(path, f"hidden size {h}, the target's {target.hidden_size}; a DFlash "
                      "head uses the target's embedding and LM head")
    bad = [i for i in ids if not 0 <= i < target.num_layers]
    if bad or len(set(ids)) != len(ids):
        raise _refuse(path, f"target_layer_ids {ids}: the target has {target.num_layers} "
                      "layers (each id once)")
    if not 0 <= int(mask) < target.vocab_size:
        raise _refuse(path, f"mask_token_id {mask} is outside the target's vocabulary "
                      f"({target.vocab_size})")
    return DFlashConfig(
        hidden_size=h, intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or h // heads), target_layer_ids=ids,
        mask_token_id=int(mask), block_size=int(_value(raw, "block_size", 16)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", 1_000_000.0)),
        attention_bias=bool(raw.get("attention_bias", False)),
        input_embedding_scale=float(_value(raw, "input_embedding_scale", 1.0)), raw=raw)


def load_head(path: str | None, target: Any, *, dummy: bool = False, seed: int = 0,
              head: nn.Module | None = None, skip: tuple[str, ...] = ()) -> DFlashHead:
    """The DFlash head of ``path`` for ``target`` (``dummy``: random weights from the config);
    ConfigError with the reason when the checkpoint does not fit. A variant passes its own
    ``head`` (a :class:`DFlashHead` with more modules, whose tensors the checkpoint must hold
    too) and the tensor prefixes it does not use (``skip``)."""
    if not path:
        raise ConfigError("DFLASH needs a DFlash draft: set --speculative-draft-model-path")
    if head is None:
        head = DFlashHead(read_config(path, target))
    params = dict(head.named_parameters())
    if dummy:
        gen = torch.Generator().manual_seed(seed)
        for p in params.values():
            if p.dim() > 1:
                p.data.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        return head
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise _refuse(path, "no *.safetensors weights")
    from safetensors.torch import load_file

    done: set[str] = set()
    for f in files:
        for name, tensor in load_file(f).items():
            key = name[len("model."):] if name.startswith("model.") else name
            key = key.replace("self_attn.", "").replace("mlp.", "")
            if key not in params and key.endswith(".weight") and key[:-7] in params:
                key = key[:-7]  # the norms are bare parameters here
            if key.startswith("candidate_selector") or "_conv." in key:
                raise _refuse(path, "a DFlash2 checkpoint (dynamic convolutions and a "
                              "candidate selector) is not built here; DFlash checkpoints are")
            if key.endswith("rotary_emb.inv_freq") or (skip and key.startswith(skip)):
                continue
            if key not in params:
                raise _refuse(path, f"unexpected tensor {name} for a DFlash head")
            if tuple(params[key].shape) != tuple(tensor.shape):
                raise _refuse(path, f"{name} has shape {tuple(tensor.shape)}, expected "
                              f"{tuple(params[key].shape)}")
            params[key].data.copy_(tensor.float())
            done.add(key)
    missing = sorted(n for n in params if n not in done)
    if missing:
        raise _refuse(path, f"missing tensors {', '.join(missing[:6])}")
    return head
