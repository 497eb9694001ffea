"""EAGLE-family draft heads in plain PyTorch, and their checkpoint loader.

Three layouts share one module (:class:`DraftHead`), selected by the checkpoint:

* ``eagle`` (EAGLE-1/2, ``LlamaForCausalLMEagle``): ``fc(cat(embed(t), f)) -> H`` (bias),
  one decoder layer whose ``input_layernorm`` is absent (identity), output ``h + residual``
  (no final norm) into the target's LM head. ``f`` is the target's final hidden state (first
  step) or the head's own output (later steps).
* ``eagle3`` (``LlamaForCausalLMEagle3``): ``fc(cat(aux_1, aux_2, aux_3)) -> H`` over three
  target layers' inputs (first step; later steps feed the head's own H-wide output), a
  midlayer whose attention reads ``cat(input_layernorm(embed(t)), hidden_norm(g))`` (2H) with
  ``g`` as the residual, a final norm and its own LM head over a draft vocabulary, mapped to
  target ids by ``d2t`` (target id = draft id + ``d2t[draft id]``).
* ``mtp`` (NEXTN, a DeepSeek-style MTP module exported alone): ``eh_proj(cat(enorm(embed(t)),
  hnorm(f)))`` (no bias), one full decoder layer, ``shared_head.norm``, the target's head.

Attention keeps the head's own K/V, cut back to the verified length each step, either per
sequence (a contiguous cache per layer: tree drafting) or for every running sequence at once
(:class:`RowCache`: a dense row per request, batched forwards of fixed shapes that a CUDA graph
can replay: chain drafting). Positions use RoPE like the target.
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
class HeadConfig:
    kind: str  #: "eagle", "eagle3" or "mtp"
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int = 1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    vocab_size: int = 0  #: draft vocabulary (eagle3), else the target's
    target_hidden_size: int = 0
    fc_bias: bool = True
    aux_layers: list[int] = field(default_factory=list)  #: eagle3: target layers read

    @property
    def fc_in(self) -> int:
        if self.kind == "eagle3":
            return self.target_hidden_size * 3
        return self.hidden_size * 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class Layer(nn.Module):
    def __init__(self, cfg: HeadConfig, qkv_in: int, input_norm: bool, hidden_norm: bool
                 ) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(qkv_in, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(qkv_in, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(qkv_in, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps) if input_norm else None
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps) if hidden_norm else None
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)

    def attend(self, x: torch.Tensor, positions: torch.Tensor,
               cache: "list[torch.Tensor] | Rows", mask: torch.Tensor | None = None
               ) -> torch.Tensor:
        """x [T, qkv_in] of new tokens after ``cache`` ([k, v] of [S, Hkv, D]); causal, or what
        ``mask`` [T, S + T] allows (draft tree nodes: the verified cache and their own
        ancestors). With :class:`Rows`, x is [B, T, qkv_in]: see there."""
        if isinstance(cache, Rows):
            return self._attend_rows(x, positions, cache)
        c, t = self.cfg, x.shape[0]
        q = rope(self.q_proj(x).view(t, c.num_heads, c.head_dim), positions, c.rope_theta)
        k = rope(self.k_proj(x).view(t, c.num_kv_heads, c.head_dim), positions, c.rope_theta)
        v = self.v_proj(x).view(t, c.num_kv_heads, c.head_dim)
        cache[0] = torch.cat([cache[0], k]) if cache[0].numel() else k
        cache[1] = torch.cat([cache[1], v]) if cache[1].numel() else v
        keys, vals = cache
        s = keys.shape[0]
        ratio = c.num_heads // c.num_kv_heads
        keys = keys.repeat_interleave(ratio, dim=1).transpose(0, 1)  # [Hq, S, D]
        vals = vals.repeat_interleave(ratio, dim=1).transpose(0, 1)
        allowed = mask if mask is not None else (
            torch.arange(s, device=x.device)[None, :]
            <= torch.arange(s - t, s, device=x.device)[:, None])
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, vals, attn_mask=allowed,
                                             scale=c.head_dim ** -0.5)
        return self.o_proj(out.transpose(0, 1).reshape(t, -1))

    def _attend_rows(self, x: torch.Tensor, positions: torch.Tensor, rows: "Rows"
                     ) -> torch.Tensor:
        c = self.cfg
        b, t = x.shape[:2]
        flat = positions.reshape(-1)
        q = rope(self.q_proj(x).view(b * t, c.num_heads, c.head_dim), flat, c.rope_theta)
        k = rope(self.k_proj(x).view(b * t, c.num_kv_heads, c.head_dim), flat, c.rope_theta)
        v = self.v_proj(x).view(b * t, c.num_kv_heads, c.head_dim)
        kb, vb = rows.cache.k[rows.layer], rows.cache.v[rows.layer]
        kb.index_put_((rows.write_rows, rows.write_pos), k)
        vb.index_put_((rows.write_rows, rows.write_pos), v)
        keys = kb[rows.rows, :rows.span]  # [B, span, Hkv, D]
        vals = vb[rows.rows, :rows.span]
        ratio = c.num_heads // c.num_kv_heads
        keys = keys.repeat_interleave(ratio, dim=2).transpose(1, 2)  # [B, Hq, span, D]
        vals = vals.repeat_interleave(ratio, dim=2).transpose(1, 2)
        q = q.view(b, t, c.num_heads, c.head_dim).transpose(1, 2)  # [B, Hq, T, D]
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=rows.mask[:, None],
                                             scale=c.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Rows:
    """A batched forward over :class:`RowCache` (for :meth:`Layer.attend` and
    :meth:`DraftHead.forward`): token ``[b, j]`` of the input is written at
    ``[write_rows, write_pos]`` (flattened over the batch; padding goes to the scratch row) and
    attends to ``[rows[b], :span]`` where ``mask`` [B, T, span] allows."""

    def __init__(self, cache: RowCache, rows: torch.Tensor, write_rows: torch.Tensor,
                 write_pos: torch.Tensor, mask: torch.Tensor, span: int) -> None:
        self.cache, self.rows, self.span = cache, rows, span
        self.write_rows, self.write_pos, self.mask = write_rows, write_pos, mask
        self.layer = 0

    def at(self, layer: int) -> "Rows":
        self.layer = layer
        return self


class DraftHead(nn.Module):
    """One of the three layouts (see the module docstring)."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        eagle3, mtp = cfg.kind == "eagle3", cfg.kind == "mtp"
        self.fc = nn.Linear(cfg.fc_in, h, bias=cfg.fc_bias and not mtp)
        self.enorm = RMSNorm(h, cfg.rms_norm_eps) if mtp else None
        self.hnorm = RMSNorm(h, cfg.rms_norm_eps) if mtp else None
        self.layers = nn.ModuleList(
            Layer(cfg, 2 * h if (eagle3 and i == 0) else h,
                  input_norm=(eagle3 or mtp or i > 0), hidden_norm=(eagle3 and i == 0))
            for i in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps) if (eagle3 or mtp) else None
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False) if eagle3 else None
        self.register_buffer("d2t", torch.zeros(cfg.vocab_size if eagle3 else 0,
                                                dtype=torch.long))

    def forward(self, embeds: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor,
                caches: list[list[torch.Tensor]],
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """One sequence's new positions: embeddings of their tokens and the features paired
        with them ([T, fc_in] target features, or [T, H] the head's own outputs); returns the
        head's hidden outputs [T, H] (fed back as the next step's features). ``mask``: see
        :meth:`Layer.attend` (default causal)."""
        cfg = self.cfg
        if cfg.kind == "mtp":
            if feats.shape[-1] == cfg.fc_in // 2:
                feats = self.hnorm(feats)
            g = self.fc(torch.cat([self.enorm(embeds), feats], -1))
        elif feats.shape[-1] != cfg.hidden_size or cfg.kind == "eagle":
            g = self.fc(torch.cat([embeds, feats], -1) if cfg.kind == "eagle" else feats)
        else:
            g = feats
        h, residual = g, g
        for i, layer in enumerate(self.layers):
            if cfg.kind == "eagle3" and i == 0:
                x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(g)], -1)
                residual = g
            else:
                residual = h if i == 0 else h
                x = layer.input_layernorm(h) if layer.input_layernorm is not None else h
            cache = caches.at(i) if isinstance(caches, Rows) else caches[i]
            a = layer.attend(x, positions, cache, mask)
            residual = a + residual
            h = layer.mlp(layer.post_attention_layernorm(residual)) + residual
        return h

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """What goes into the LM head: the final norm where the layout has one."""
        return self.norm(hidden) if self.norm is not None else hidden


# ---------------------------------------------------------------------- loading


def _kind(arch: str, names: set[str]) -> str:
    a = arch.lower()
    if "eagle3" in a or any(n.startswith("midlayer") for n in names):
        return "eagle3"
    if "nextn" in a or "mtp" in a or any("eh_proj" in n for n in names):
        return "mtp"
    return "eagle"


def _rename(name: str) -> str:
    for prefix in ("model.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.startswith("midlayer."):
        name = "layers.0." + name[len("midlayer."):]
    if name.startswith("midlayers."):
        name = "layers." + name[len("midlayers."):]
    for part in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head"):
        if name.startswith(f"layers.0.{part}."):
            name = name[len("layers.0."):]
    name = name.replace("eh_proj.", "fc.").replace("shared_head.norm.", "norm.")
    for proj in ("gate_proj", "up_proj", "down_proj"):
        name = name.replace(f"mlp.{proj}.", f"{proj}.")
    return name.replace("self_attn.", "")


def _read_tensors(path: str) -> dict[str, torch.Tensor]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    tensors: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            tensors.update(load_file(f))
        return tensors
    files = sorted(glob.glob(os.path.join(path, "*.bin")) + glob.glob(os.path.join(path, "*.pt")))
    for f in files:
        tensors.update(torch.load(f, map_location="cpu", weights_only=True))
    if not tensors:
        raise ConfigError(f"--speculative-draft-model-path {path}: no *.safetensors or *.bin "
                          "weights found")
    return tensors


def load_head(path: str | None, target: Any, *, dummy: bool = False, want: str | None = None,
              seed: int = 0) -> DraftHead:
    """The draft head of ``path`` (a directory with config.json and weights) for ``target``;
    ``dummy``: random weights from the config. ``want``: the layout the algorithm expects.
    Raises ConfigError with the reason when the checkpoint does not fit."""
    if not path:
        raise ConfigError("this algorithm needs a draft head: set --speculative-draft-model-path")
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise ConfigError(f"--speculative-draft-model-path {path}: no config.json")
    with open(cfg_file) as f:
        raw = json.load(f)
    tensors = {} if dummy else _read_tensors(path)
    arch = (raw.get("architectures") or [""])[0]
    kind = _kind(arch, {_n for _n in tensors}) if tensors or arch else "eagle"
    if dummy and want:
        kind = want if kind == "eagle" else kind
    if want == "eagle3" and kind != "eagle3":
        raise ConfigError(f"--speculative-draft-model-path {path}: an {kind} head ({arch}); "
                          "EAGLE3 needs an EAGLE-3 checkpoint (fc over three target layers)")
    if want == "eagle" and kind == "eagle3":
        raise ConfigError(f"--speculative-draft-model-path {path}: an EAGLE-3 head; use "
                          "--speculative-algorithm EAGLE3")
    h = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    eagle3 = kind == "eagle3"
    ext = raw.get("eagle_config") or {}
    aux = list(ext.get("eagle_aux_hidden_state_layer_ids") or [])
    if eagle3 and not aux:
        n = target.num_layers
        aux = [min(2, n - 1), n // 2, max(n - 3, 0)]
    cfg = HeadConfig(
        kind=kind, hidden_size=h, intermediate_size=int(raw["intermediate_size"]),
        num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or h // heads),
        num_layers=int(raw.get("num_hidden_layers", 1)) if not eagle3 else
        int(raw.get("num_hidden_layers", 1)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        vocab_size=int(raw.get("draft_vocab_size") or raw.get("vocab_size") or target.vocab_size)
        if eagle3 else target.vocab_size,
        target_hidden_size=int(raw.get("target_hidden_size") or target.hidden_size),
        fc_bias=bool(raw.get("bias", True)) if not eagle3 else bool(raw.get("bias", False)),
        aux_layers=aux)
    if kind in ("eagle", "mtp") and h != target.hidden_size:
        raise ConfigError(f"--speculative-draft-model-path {path}: hidden size {h}, the target's "
                          f"{target.hidden_size}; an {kind} head reads the target's features")
    if kind == "mtp":
        cfg.num_layers = 1
    head = DraftHead(cfg)
    if dummy:
        gen = torch.Generator().manual_seed(seed)
        for p in head.parameters():
            if p.dim() > 1:
                p.data.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        if eagle3 and cfg.vocab_size != target.vocab_size:
            head.d2t.copy_(torch.arange(cfg.vocab_size) * (target.vocab_size // cfg.vocab_size)
                           - torch.arange(cfg.vocab_size))
        return head
    _load(head, tensors, path, eagle3 and "lm_head.weight" not in {_rename(n) for n in tensors},
          target)
    return head


_SKIP = ("embed_tokens.weight", "lm_head.weight", "t2d", "shared_head.head.weight",
         "rotary_emb.inv_freq")


def _load(head: DraftHead, tensors: dict[str, torch.Tensor], path: str, no_head: bool,
          target: Any) -> None:
    params = dict(head.named_parameters())
    buffers = dict(head.named_buffers())
    done: set[str] = set()
    for name, tensor in tensors.items():
        key = _rename(name)
        if key == "d2t":
            buffers["d2t"].copy_(tensor.long())
            continue
        if key == "lm_head.weight" and head.lm_head is not None:
            pass
        elif any(key.endswith(s) for s in _SKIP) and key != "lm_head.weight" or (
                key == "lm_head.weight" and head.lm_head is None):
            continue
        if key not in params and key.endswith("input_layernorm.weight"):
            continue  # an EAGLE layer 0 runs without it (identity), as the layout defines
        if key not in params:
            raise ConfigError(f"--speculative-draft-model-path {path}: unexpected tensor {name} "
                              f"for a {head.cfg.kind} head")
        if tuple(params[key].shape) != tuple(tensor.shape):
            raise ConfigError(f"--speculative-draft-model-path {path}: {name} has shape "
                              f"{tuple(tensor.shape)}, expected {tuple(params[key].shape)}")
        params[key].data.copy_(tensor.float())
        done.add(key)
    optional = {n for n in params if n.endswith("norm.weight")} | {"fc.bias"}
    if no_head:
        if head.cfg.vocab_size != target.vocab_size:
            raise ConfigError(f"--speculative-draft-model-path {path}: no lm_head for a draft "
                              f"vocabulary of {head.cfg.vocab_size}")
        head.lm_head = None
        optional.add("lm_head.weight")
    missing = sorted(n for n in params if n not in done and n not in optional)
    if missing:
        raise ConfigError(f"--speculative-draft-model-path {path}: missing tensors "
                          f"{', '.join(missing[:6])}")
