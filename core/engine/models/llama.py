"""One decoder for the Llama family: Llama 2/3/3.1, SmolLM2, Mistral, Qwen2 (qkv bias) and Qwen3
(per-head q/k RMSNorm), with tied or untied embeddings.

Checkpoint names are HF's (``model.layers.N.self_attn.q_proj.weight``...). Projections that read
the same input are fused at load (``qkv_proj``, ``gate_up_proj``): each shard is copied into its
rows by :meth:`LlamaForCausalLM.load_weights`, so a decode step runs 4 matmuls per layer. Every
layer calls the attention backend once, with RoPE already applied by ``batch.positions``.

The same decoder serves the mixture-of-experts members of these families (Mixtral, Qwen2-MoE,
Qwen3-MoE, OLMoE): their sparse layers replace the MLP with a
:class:`~engine.models.moe.SparseMoeBlock` whose expert work goes to the chosen MoE runner.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ConfigError
from engine.models.config import ModelConfig
from engine.models.moe import ExpertWeights, SparseMoeBlock
from engine.runtime.attention import AttentionBackend, AttentionLayerSpec
from engine.runtime import fused
from engine.runtime.batch import Batch
from engine.runtime.linear import (Embedding, GroupCodes, Linear, PackedWeight, QuantMethod,
                                   UnquantizedMethod, dense_linear, fused_gemv_weight, rowwise,
                                   weight_tensors)

#: builds the quantization method of one linear layer from its qualified name (None: dense)
QuantFactory = Callable[[str], "QuantMethod | None"]


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 and cast back before the weight."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        ops = fused.for_tensor(x) if x.dim() == 2 else None
        if ops is not None:  # one kernel (float32 on the CPU: the decode plan's, row by row)
            return ops.add_rms_norm(x, None, self.weight, self.eps)[0]
        if dtype == torch.float32:  # one fused op, the same arithmetic
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                    codes: tuple[torch.dtype, int] | None = None
                    ) -> "tuple[torch.Tensor | GroupCodes, torch.Tensor]":
        """(norm(x + residual), x + residual); one kernel where :func:`fused.for_tensor` has
        one (half precision on a GPU, float32 on the CPU). ``codes`` (the next layer's
        :meth:`Linear.group_codes`): the normed rows as its :class:`GroupCodes` where that
        kernel makes them."""
        ops = fused.for_tensor(x) if x.dim() == 2 else None
        if ops is not None:
            make = getattr(ops, "add_rms_norm_groups", None) if codes else None
            if make is not None:
                return make(x, residual, self.weight, self.eps, *codes)
            return ops.add_rms_norm(x, residual, self.weight, self.eps)
        total = x if residual is None else x + residual
        return self(total), total


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in float32, with the config's rope scaling applied."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = dict(cfg.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        return torch.where(medium, smoothed, scaled)
    raise ConfigError(f"rope scaling type {kind!r} is not supported (default, linear, llama3)")


class Rotary(nn.Module):
    """Rotate-half RoPE from a [max_pos, head_dim] cos/sin cache indexed by positions.

    ``rotate_half(x) * sin`` is computed as ``swap_halves(x) * sin_signed`` (the first half of
    ``sin_signed`` negated): the same products, one op instead of three.

    ``freq_factors`` (GGUF ``rope_freqs.weight``, llama3-style checkpoints) divide the inverse
    frequencies when the loader sets them.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.max_pos = cfg.max_position_embeddings
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self._build()

    def _build(self) -> None:
        # built on the CPU in float32 (also under a ``torch.device`` context), then moved
        t = torch.arange(self.max_pos, dtype=torch.float32, device="cpu")
        freqs = torch.outer(t, self.inv_freq.float().cpu())
        emb = torch.cat((freqs, freqs), dim=-1)
        device = self.inv_freq.device
        half = emb.shape[-1] // 2
        sin = emb.sin()
        sin[:, :half].neg_()
        self.register_buffer("cos_cache", emb.cos().to(device), persistent=False)
        self.register_buffer("sin_cache", sin.to(device), persistent=False)

    def set_freq_factors(self, factors: torch.Tensor) -> None:
        self.inv_freq = self.inv_freq / factors.float().to(self.inv_freq.device)
        self._build()

    def forward(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin_signed [T, 1, head_dim] for the tokens at ``positions``."""
        cos = self.cos_cache.index_select(0, positions).to(dtype).unsqueeze(1)
        sin = self.sin_cache.index_select(0, positions).to(dtype).unsqueeze(1)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``sin_signed`` from :class:`Rotary`."""
    *lead, dim = x.shape
    swapped = x.reshape(*lead, 2, dim // 2).flip(-2).reshape(x.shape)
    return x * cos + swapped * sin_signed


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype,
                 quant: QuantFactory, prefix: str) -> None:
        super().__init__()
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size, self.kv_size = self.hq * self.d, self.hkv * self.d
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                               bias=cfg.attention_bias, dtype=dtype,
                               quant_method=quant(prefix + ".qkv_proj"),
                               shards=(self.q_size, self.kv_size, self.kv_size))
        self.o_proj = Linear(self.q_size, cfg.hidden_size, dtype=dtype,
                             quant_method=quant(prefix + ".o_proj"))
        # per-head norms (Qwen3) or over the whole projection (OLMoE)
        self.full_qk_norm = cfg.qk_norm_scope == "full"
        q_dim, k_dim = (self.q_size, self.kv_size) if self.full_qk_norm else (self.d, self.d)
        self.q_norm = RMSNorm(q_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.clip_qkv = cfg.clip_qkv
        self.spec = AttentionLayerSpec(layer_id=layer_id, num_q_heads=self.hq,
                                       num_kv_heads=self.hkv, head_dim=self.d,
                                       scaling=self.d ** -0.5)

    @property
    def fusable(self) -> bool:
        """q/k norms (if any) per head and no clipping: one fused norm + RoPE kernel fits."""
        return not self.full_qk_norm and self.clip_qkv is None

    def forward(self, x: torch.Tensor, rope: "RopeInputs", batch: Batch,
                attn: AttentionBackend) -> torch.Tensor:
        return self.attend_qkv(self.qkv_proj(x), rope, batch, attn)

    def attend_qkv(self, qkv: torch.Tensor, rope: "RopeInputs", batch: Batch,
                   attn: AttentionBackend, project: bool = True) -> torch.Tensor:
        """The layer's output from its q/k/v projection ``qkv`` [T, q + 2 kv] (``project``
        false: attention's output [T, q], before the output projection)."""
        codes = self.o_proj.group_codes(qkv[:, :self.q_size]) if project else None
        out = self._attend(qkv, rope, batch, attn, codes)
        if isinstance(out, GroupCodes):  # written by attention's own kernel
            return self.o_proj(out)
        out = out.reshape(qkv.shape[0], self.q_size)
        return self.o_proj(out) if project else out

    def _attend(self, qkv: torch.Tensor, rope: "RopeInputs", batch: Batch,
                attn: AttentionBackend, codes: tuple[torch.dtype, int] | None = None
                ) -> "torch.Tensor | GroupCodes":
        """Attention's output [T, Hq, D]; with ``codes`` (the output projection's
        :meth:`Linear.group_codes`) its :class:`GroupCodes` where the backend writes them
        (:meth:`AttentionBackend.attend_codes`)."""
        t = qkv.shape[0]
        if rope.cos is None:  # the fused path (see LlamaForCausalLM.forward)
            qn, kn = self.q_norm, self.k_norm
            store = getattr(rope.ops, "qk_norm_rope_store", None)
            # (a backend that reads an extend's new K/V as rows gets them through forward)
            rows = not batch.is_decode and attn.reads_new_kv(batch)
            enabled = getattr(rope.ops, "l2_prefetch_enabled", None)
            if batch.is_decode and enabled is not None and enabled(qkv.device):
                # the output projection's weights asked into L2 while attention runs (it
                # reads little memory at decode): a hint, off unless ENGINE_L2_PREFETCH=1
                rope.ops.l2_prefetch(weight_tensors(self.o_proj))
            if (store is not None and not rows
                    and attn.pool.takes_direct_writes(qkv.dtype, qkv.device)):
                # K/V go into the pool in the same kernel (no separate cache write)
                lid = self.spec.layer_id
                q = store(qkv, self.hq, self.hkv, self.d, rope.positions, rope.rotary.cos_cache,
                          rope.rotary.sin_cache, qn.weight if qn is not None else None,
                          kn.weight if kn is not None else None, qn.eps if qn is not None else 0.0,
                          attn.pool.k[lid], attn.pool.v[lid], batch.out_cache_loc,
                          attn.pool.k_scale[lid], attn.pool.v_scale[lid])
                written = attn.attend_codes(q, self.spec, batch, codes) if codes else None
                return written if written is not None else attn.attend(q, self.spec, batch)
            q, k = rope.ops.qk_norm_rope(qkv, self.hq, self.hkv, self.d, rope.positions,
                                      rope.rotary.cos_cache, rope.rotary.sin_cache,
                                      qn.weight if qn is not None else None,
                                      kn.weight if kn is not None else None,
                                      qn.eps if qn is not None else 0.0)
            v = qkv[:, self.q_size + self.kv_size:].view(t, self.hkv, self.d)
        else:
            q, k, v = self._qkv(qkv, rope.cos, rope.sin)
        return attn.forward(q, k, v, self.spec, batch)

    def _qkv(self, qkv: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (normed as the model says, rotated) and v per head, with torch ops."""
        t = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.full_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:  # after the whole-projection norms (OLMoE)
            c = self.clip_qkv
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q = q.view(t, self.hq, self.d)
        k = k.view(t, self.hkv, self.d)
        v = v.view(t, self.hkv, self.d)
        if self.q_norm is not None and not self.full_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: QuantFactory,
                 prefix: str, width: int | None = None) -> None:
        super().__init__()
        self.inter = width or cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.inter, dtype=dtype,
                                   quant_method=quant(prefix + ".gate_up_proj"),
                                   shards=(self.inter, self.inter))
        self.down_proj = Linear(self.inter, cfg.hidden_size, dtype=dtype,
                                quant_method=quant(prefix + ".down_proj"))
        if cfg.hidden_act == "silu":
            self.act: Callable[[torch.Tensor], torch.Tensor] = F.silu
        else:
            from transformers.activations import ACT2FN

            if cfg.hidden_act not in ACT2FN:
                raise ConfigError(f"hidden_act {cfg.hidden_act!r} is not supported")
            self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_gate_up(self.gate_up_proj(x))

    def from_gate_up(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The output from the gate/up projection ``gate_up`` [T, 2 * inter]."""
        ops = fused.for_tensor(gate_up) if self.act is F.silu and gate_up.dim() == 2 else None
        if ops is not None:
            w = fused_gemv_weight(self.down_proj, gate_up)
            if w is not None:  # SiLU-and-mul inside the down projection's loads
                from engine.runtime.gemv_triton import gemv_silu

                return gemv_silu(gate_up, w, self.down_proj.bias)
            codes = self.down_proj.group_codes(gate_up[:, :self.inter])
            make = getattr(ops, "silu_and_mul_groups", None) if codes else None
            if make is not None:  # the activations as the down projection's input codes
                return self.down_proj(make(gate_up, *codes))
            return self.down_proj(ops.silu_and_mul(gate_up))
        gate, up = gate_up.split([self.inter, self.inter], dim=-1)
        return self.down_proj(self.act(gate) * up)


def sparse_block(cfg: ModelConfig, layer_id: int, dtype: torch.dtype, quant: QuantFactory,
                 prefix: str, experts: "ExpertParts | None") -> SparseMoeBlock:
    if experts is None:
        raise ConfigError(f"{cfg.architecture} has routed experts: build it with a MoE runner "
                          "and all-to-all (engine serve does)")
    method = quant(prefix + ".experts")
    quantized = method is not None and not isinstance(method, UnquantizedMethod)
    if quantized and not method.serves_experts:
        raise ConfigError(f"{cfg.architecture}: routed experts quantized by "
                          f"{type(method).__name__} are not served yet (experts are served for "
                          "weight-only, fp8, int8 W8A8, MX and experts-only formats)")
    shared = (MLP(cfg, dtype, quant, prefix + ".shared_expert",
                  width=cfg.shared_expert_intermediate_size)
              if cfg.shared_expert_intermediate_size > 0 else None)
    block = SparseMoeBlock(cfg, layer_id, dtype, runner=experts[0], a2a=experts[1],
                           shared=shared, prefix=prefix,
                           act_quant=method.expert_activation() if quantized else None)
    if quantized:  # each expert's projections load through the format, then go in dense
        block.experts.quant = quant
    return block


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype,
                 quant: QuantFactory, experts: "ExpertParts | None" = None) -> None:
        super().__init__()
        prefix = f"model.layers.{layer_id}"
        self.self_attn = Attention(cfg, layer_id, dtype, quant, prefix + ".self_attn")
        self.mlp: nn.Module = (
            sparse_block(cfg, layer_id, dtype, quant, prefix + ".mlp", experts)
            if cfg.is_sparse_layer(layer_id) else MLP(cfg, dtype, quant, prefix + ".mlp"))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    def forward(self, h: torch.Tensor, residual: "torch.Tensor | SumSq | None",
                rope: "RopeInputs", batch: Batch, attn: AttentionBackend
                ) -> "tuple[torch.Tensor, torch.Tensor | SumSq]":
        """(hidden, residual) -> (mlp output, residual before the mlp); sum them for the
        layer's output (:func:`stream`). A residual :class:`SumSq` means ``h`` is the sum
        already (the chained one-row layer below)."""
        weights = self._chain_weights(h)
        if weights is not None:
            return self._chained(h, residual, rope, batch, attn, weights)
        weights = self._sparse_chain_weights(h)
        if weights is not None:
            return self._chained_sparse(h, residual, rope, batch, attn, weights)
        if isinstance(residual, SumSq):
            residual = None
        at, mlp = self.self_attn, self.mlp
        qkv, residual = _norm_linear(self.input_layernorm, at.qkv_proj, h, residual)
        if qkv is not None:  # the norm inside the q/k/v projection's loads
            h = at.attend_qkv(qkv, rope, batch, attn)
        else:
            normed, residual = self.input_layernorm.add_forward(
                h, residual, codes=at.qkv_proj.group_codes(h))
            h = at(normed, rope, batch, attn)
        codes = None
        if isinstance(mlp, MLP):
            gate_up, residual_mlp = _norm_linear(self.post_attention_layernorm,
                                                 mlp.gate_up_proj, h, residual)
            if gate_up is not None:
                return mlp.from_gate_up(gate_up), residual_mlp
            codes = mlp.gate_up_proj.group_codes(h)
        normed, residual = self.post_attention_layernorm.add_forward(h, residual, codes=codes)
        return mlp(normed), residual

    def _chain_weights(self, h: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The (qkv, o, gate/up, down) weights when this layer runs chained
        (:func:`engine.runtime.gemv_triton.gemv_chain`; ``ENGINE_GEMV_CHAIN=0`` turns it off):
        one row in half precision where the fused kernels and the one-row products serve it, a
        dense SiLU MLP, and four dense projections of that dtype with no forward hooks (LoRA);
        else None."""
        mlp = self.mlp
        if not _chain_row(h) or not isinstance(mlp, MLP) or mlp.act is not F.silu:
            return None
        linears = (self.self_attn.qkv_proj, self.self_attn.o_proj, mlp.gate_up_proj,
                   mlp.down_proj)
        if not all(_chains(lin, h, glu=i == 2) for i, lin in enumerate(linears)):
            return None
        return tuple(lin.weight for lin in linears)

    def _sparse_chain_weights(self, h: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The (qkv, o, router) weights when this sparse layer's attention half and router run
        chained (:meth:`_chained_sparse`; ``ENGINE_SPARSE_CHAIN=0``: never): as
        :meth:`_chain_weights` asks of the dense layer, with a half-precision router of that
        dtype in place of the MLP; else None."""
        mlp = self.mlp
        if os.environ.get("ENGINE_SPARSE_CHAIN") == "0" or not isinstance(mlp, SparseMoeBlock) \
                or not _chain_row(h):
            return None
        from engine.runtime import gemv_triton

        at, gate = self.self_attn, mlp.gate
        if not (_chains(at.qkv_proj, h) and _chains(at.o_proj, h)) \
                or gate._forward_hooks or gate._forward_pre_hooks \
                or gate.weight.dtype != h.dtype or gate.bias is not None \
                or not gemv_triton.chain_serves(*gate.weight.shape):
            return None
        return at.qkv_proj.weight, at.o_proj.weight, gate.weight

    def _chained(self, h: torch.Tensor, residual: "torch.Tensor | SumSq | None",
                 rope: "RopeInputs", batch: Batch, attn: AttentionBackend,
                 weights: tuple[torch.Tensor, ...]) -> "tuple[torch.Tensor, SumSq]":
        """The layer at one row with no kernels between its products but attention's: the
        output and down projections add the residual in their epilogues and leave partial
        sums of squares, from which the q/k/v and gate/up projections norm their input; the
        gate/up projection ends in SiLU-and-mul."""
        from engine.runtime.gemv_triton import gemv_chain

        mlp, ln2 = self.mlp, self.post_attention_layernorm
        wqkv, wo, wgu, wd = weights
        h2, ss = self._chained_attention(h, residual, rope, batch, attn, wqkv, wo)
        act = gemv_chain(h2, wgu, mlp.gate_up_proj.bias, sumsq=ss, norm_w=ln2.weight,
                         eps=ln2.eps, glu=True)[0]
        h3, ss = gemv_chain(act, wd, mlp.down_proj.bias, residual=h2)
        return h3, SumSq(ss)

    def _chained_attention(self, h: torch.Tensor, residual: "torch.Tensor | SumSq | None",
                           rope: "RopeInputs", batch: Batch, attn: AttentionBackend,
                           wqkv: torch.Tensor, wo: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """The chained layers' attention half: the q/k/v projection (norming its input from
        the previous chained layer's partial sums of squares where it left them), attention,
        and the output projection adding the residual. Returns (the residual stream after
        attention, its partial sums of squares)."""
        from engine.runtime.gemv_triton import gemv_chain

        at, ln1 = self.self_attn, self.input_layernorm
        if isinstance(residual, SumSq):
            qkv = gemv_chain(h, wqkv, at.qkv_proj.bias, sumsq=residual.partials,
                             norm_w=ln1.weight, eps=ln1.eps)[0]
            stream = h
        else:
            normed, stream = ln1.add_forward(h, residual)
            qkv = at.qkv_proj(normed)
        out = at.attend_qkv(qkv, rope, batch, attn, project=False)
        return gemv_chain(out, wo, at.o_proj.bias, residual=stream)

    def _chained_sparse(self, h: torch.Tensor, residual: "torch.Tensor | SumSq | None",
                        rope: "RopeInputs", batch: Batch, attn: AttentionBackend,
                        weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """A sparse layer at one row, its attention half chained as the dense layer's: the
        output projection adds the residual in its epilogue and leaves partial sums of
        squares, from which the router norms its input and writes the normed row for the
        experts (no norm kernel between them), then a top-k kernel. Returns (the experts' output,
        the residual stream before them), or, where the runner adds the residual in its
        combine (``MoERunner.apply_residual``; ``ENGINE_SPARSE_RESIDUAL=0``: never), (the
        residual stream after the layer, :class:`SumSq` of its pieces) as the dense chained
        layer returns."""
        from engine.runtime.gemv_triton import gemv_chain

        mlp, ln2 = self.mlp, self.post_attention_layernorm
        wqkv, wo, wgate = weights
        h2, ss = self._chained_attention(h, residual, rope, batch, attn, wqkv, wo)
        normed = torch.empty_like(h2)
        logits = gemv_chain(h2, wgate, sumsq=ss, norm_w=ln2.weight, eps=ln2.eps,
                            normed_out=normed)[0]
        routed = mlp.route(logits)
        if os.environ.get("ENGINE_SPARSE_RESIDUAL") != "0":
            # the runner adds the residual and leaves the sums of squares that the next
            # layer's q/k/v projection norms from (no add + norm kernel before it)
            done = mlp.forward_residual(normed, h2, routed)
            if done is not None:
                return done[0], SumSq(done[1].reshape(-1))
        return mlp(normed, router_logits=logits, routed=routed), h2


def _chain_row(h: torch.Tensor) -> bool:
    """Whether ``h`` is one half-precision row that the chained layers serve: the fused
    kernels run on it and :func:`engine.runtime.gemv_triton.chain` holds on its device."""
    if h.dim() != 2 or h.shape[0] != 1 or not fused.enabled(h):
        return False
    from engine.runtime import gemv_triton

    return gemv_triton.chain(h.device)


def _chains(lin: Linear, h: torch.Tensor, glu: bool = False) -> bool:
    """Whether ``lin`` may run as a chained one-row product on ``h`` (a dense layer of h's
    dtype, no forward hooks (LoRA), not multiplied row by row, a weight ``gemv_chain``
    serves)."""
    from engine.runtime import gemv_triton

    return (isinstance(lin.quant_method, UnquantizedMethod) and not lin.row_by_row
            and not lin._forward_hooks and not lin._forward_pre_hooks
            and lin.weight.dtype == h.dtype
            and gemv_triton.chain_serves(*lin.weight.shape, glu=glu))


@dataclass(frozen=True)
class SumSq:
    """A chained layer's residual: its output is the residual stream itself, and
    ``partials`` are the sums of squares of its pieces that the writing kernel left."""

    partials: torch.Tensor


def stream(h: torch.Tensor, residual: "torch.Tensor | SumSq | None") -> torch.Tensor:
    """The residual stream after a layer that returned (``h``, ``residual``)."""
    return h if residual is None or isinstance(residual, SumSq) else h + residual


def _norm_linear(norm: RMSNorm, linear: Linear, h: torch.Tensor, residual: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(``linear(norm(h + residual))``, ``h + residual``) in one matrix-vector kernel where
    :func:`~engine.runtime.linear.fused_gemv_weight` allows it, else (None, ``residual``)."""
    w = fused_gemv_weight(linear, h)
    if w is None:
        return None, residual
    from engine.runtime.gemv_triton import gemv_norm

    return gemv_norm(h, residual, norm.weight, norm.eps, w, linear.bias)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: QuantFactory,
                 experts: "ExpertParts | None" = None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, quant, experts)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.rotary = Rotary(cfg)


#: checkpoint projection -> (fused parameter, shard index)
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
#: per-expert checkpoint projection (HF, Mixtral) -> (stacked parameter, shard)
_EXPERT = {"gate_proj": ("w13", 0), "w1": ("w13", 0), "up_proj": ("w13", 1), "w3": ("w13", 1),
           "down_proj": ("w2", 0), "w2": ("w2", 0)}
#: stacked checkpoint tensors (transformers 5 in-memory layout) -> parameter
_STACKED = {"gate_up_proj": "w13", "down_proj": "w2"}
#: per-layer KV-cache scales as checkpoints name them (compressed-tensors ``self_attn.k_scale``,
#: ModelOpt ``k_proj.k_scale``, Quark ``k_proj.output_scale``, legacy ``kv_scale``)
_KV_SCALE = re.compile(r"\.(?:self_attn\.(?:k|v)_scale|(?:k|v)_proj\.(?:k_scale|v_scale|output_scale)"
                       r"|kv_scale)$")
_EXPERT_NAME = re.compile(r"^(.*\.mlp)\.experts\.(?:(\d+)\.(\w+)\.(\w+)|(\w+))$")

#: (runner, all-to-all) of the sparse layers (:mod:`engine.api.moe`)
ExpertParts = tuple[Any, Any]


@dataclass(frozen=True)
class RopeInputs:
    """Positions of a forward's tokens with their cos/sin rows (``None`` when the fused kernel
    reads the rotary caches itself)."""

    positions: torch.Tensor
    rotary: Rotary
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    ops: Any = None  #: the fused-kernel module (see :func:`fused.for_tensor`) when cos is None


def _copy_into(param: nn.Parameter, name: str, tensor: Any, offset: int = 0,
               size: int | None = None) -> None:
    """Checkpoint tensor ``name`` into ``param`` (rows ``offset:offset+size`` of it for a fused
    shard): through the parameter's ``weight_loader`` when it has one (quantized layouts),
    else a checked copy (packed blocks dequantized first)."""
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        try:
            loader(param, tensor, offset, size)
        except ConfigError as exc:
            raise ConfigError(f"checkpoint tensor {name!r}: {exc}") from None
        return
    if isinstance(tensor, PackedWeight):
        tensor = tensor.dequantize()
    dst = param.data if size is None else param.data.narrow(0, offset, size)
    if tuple(dst.shape) != tuple(tensor.shape):
        raise ConfigError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                          f"expected {tuple(dst.shape)}")
    dst.copy_(tensor)


class LlamaForCausalLM(nn.Module):
    """``forward(input_ids, positions, batch, attn, logits_indices)`` -> final hidden states of
    the selected tokens; :meth:`compute_logits` projects them onto the vocabulary (one row at a
    time with ``row_by_row``, as every :class:`Linear` then does)."""

    row_by_row: bool = False

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype = torch.float32,
                 quant: QuantFactory | None = None, experts: ExpertParts | None = None) -> None:
        super().__init__()
        self.config = cfg
        quant = quant or (lambda name: None)
        self.model = LlamaModel(cfg, dtype, quant, experts)
        head_method = quant("lm_head")
        # a tied head shares the embedding's dense weight, unless a quantization method wants
        # its own copy (loaded from the embedding's checkpoint tensor)
        self.head_copies_embedding = cfg.tie_word_embeddings and head_method is not None
        self.lm_head = None if cfg.tie_word_embeddings and head_method is None else Linear(
            cfg.hidden_size, cfg.vocab_size, dtype=dtype, quant_method=head_method)
        self._plans: dict[int, Any] = {}  # KV pool id -> CPU decode plan (False: none fits)
        self._no_plan = os.environ.get("ENGINE_CPU_DECODE_PLAN") == "0"
        # a packed (quantized GGUF) embedding table stays packed unless the head reads it dense
        self.model.embed_tokens.keep_packed = self.lm_head is not None
        self.fused_rope = all(layer.self_attn.fusable for layer in self.model.layers) and \
            cfg.head_dim % 2 == 0 and (cfg.head_dim // 2) & (cfg.head_dim // 2 - 1) == 0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Batch,
                attn: AttentionBackend, logits_indices: torch.Tensor,
                logits: bool = False) -> torch.Tensor:
        """The final (normed) hidden states of the rows ``logits_indices``; with ``logits``,
        their float32 logits (:meth:`compute_logits`), which the CPU decode plan computes in
        its own call."""
        pool = getattr(attn, "pool", None)
        loads = pool.take_loads() if pool is not None else None
        try:
            out, is_logits = self._layers(input_ids, positions, batch, attn, logits_indices,
                                          loads, logits)
            return out if is_logits or not logits else self.compute_logits(out).float()
        finally:
            if loads is not None:  # (what an error left unwaited: later work comes after it)
                loads.wait_all()

    def _layers(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Batch,
                attn: AttentionBackend, logits_indices: torch.Tensor, loads: Any,
                logits: bool = False) -> tuple[torch.Tensor, bool]:
        """The forward: (the rows' final hidden states, False), or (their logits, True) where
        ``logits`` asks and the decode plan computes them. ``loads``: copies into the KV pool
        still in flight (the pool's :attr:`~engine.runtime.attention.KVPool.loads`), waited
        for layer by layer."""
        m = self.model
        h = m.embed_tokens(input_ids)
        plan = self._decode_plan(batch, attn, h)
        if plan is not None:  # the whole decode forward in one C call (CPU)
            if loads is not None:
                loads.wait_all()
            seq = batch.seq_lens_cpu
            head = logits and plan.head_serves(h.shape[0])
            h = plan.run(h, positions, batch.out_cache_loc, batch.req_to_token,
                         batch.req_pool_indices, batch.seq_lens,
                         max(seq) if seq else int(batch.seq_lens.max()),
                         logits_indices if head else None)
            if head:
                return h, True
            return m.norm(h.index_select(0, logits_indices)), False
        ops = fused.for_tensor(h) if self.fused_rope else None
        if ops is not None:
            rope = RopeInputs(positions, m.rotary, ops=ops)
        else:
            rope = RopeInputs(positions, m.rotary, *m.rotary(positions, h.dtype))
        residual = None
        sink = self.feature_sink
        aux: list[torch.Tensor] = []
        for i, layer in enumerate(m.layers):
            if loads is not None:
                loads.wait(i)
            if sink is not None and i in sink.layers:
                aux.extend([stream(h, residual)] * sink.layers.count(i))
            h, residual = layer(h, residual, rope, batch, attn)
        h = stream(h, residual)
        if sink is not None:  # speculative drafts read every token's features
            # past the last layer: the final normed state (the last of transformers'
            # hidden_states, which feature-trained drafts were trained on)
            aux.extend([m.norm(h)] * sink.layers.count(len(m.layers)))
            sink.write(batch, torch.cat(aux, -1) if sink.layers else m.norm(h))
        return m.norm(h.index_select(0, logits_indices)), False

    def _decode_plan(self, batch: Batch, attn: AttentionBackend, h: torch.Tensor) -> Any:
        """The CPU decode plan serving this forward (built once per KV pool), or ``None``: a
        float32 CPU decode batch whose attention backend decodes straight from the pool, no
        feature sink, a model every layer of which the plan covers, and a batch it serves
        (:meth:`~engine.runtime.fused_cpu.DecodePlan.serves`). ``ENGINE_CPU_DECODE_PLAN=0``:
        never (the per-operation path, for comparisons)."""
        if self.feature_sink is not None or self._no_plan or not (
                batch.is_decode and h.dtype is torch.float32 and h.device.type == "cpu"
                and attn.decodes_from_pool(batch)):
            return None
        plan = self._plans.get(id(attn.pool))
        if plan is None:
            plan = self._plans[id(attn.pool)] = self._build_plan(attn.pool) or False
        return plan if plan and plan.serves(h.shape[0]) else None

    def _build_plan(self, pool: Any) -> Any:
        from engine.runtime import fused_cpu

        m, cfg = self.model, self.config
        if not (self.fused_rope and fused_cpu.available() and cfg.hidden_act == "silu"
                and pool.dtype in fused_cpu.KV_TYPES):  # (the plan writes K/V itself)
            return None
        rows, modules = [], []
        for layer in m.layers:
            at, mlp = layer.self_attn, layer.mlp
            if not isinstance(mlp, MLP) or mlp.act is not F.silu or \
                    mlp.inter != cfg.intermediate_size:
                return None
            linears = (at.qkv_proj, at.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if any(lin.row_by_row or (lin.bias is not None and (
                    lin.bias.dtype != torch.float32 or not lin.bias.is_contiguous()))
                   for lin in linears):
                return None
            kernels = [lin.quant_method.native_kernel(lin) for lin in linears]
            if any(k is None for k in kernels):
                return None
            modules += linears
            qn, kn = at.q_norm, at.k_norm
            rows.append((layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                         qn.weight if qn is not None else None,
                         kn.weight if kn is not None else None, kernels,
                         [lin.bias for lin in linears], pool.k[at.spec.layer_id],
                         pool.v[at.spec.layer_id]))
        head, lm = None, self.lm_head  # the final norm and the head too, where they fit
        norm_w = m.norm.weight
        kernel = lm.quant_method.native_kernel(lm) if lm is not None and not lm.row_by_row \
            and os.environ.get("ENGINE_CPU_PLAN_HEAD") != "0" else None  # (=0: for comparisons)
        if kernel is not None and norm_w.dtype == torch.float32 and norm_w.is_contiguous() \
                and m.norm.eps == cfg.rms_norm_eps and (lm.bias is None or (
                    lm.bias.dtype == torch.float32 and lm.bias.is_contiguous())):
            head = (norm_w, kernel, lm.bias, cfg.vocab_size)
            modules += [lm, m.norm]
        return fused_cpu.DecodePlan(rows, hidden=cfg.hidden_size,
                                    num_q_heads=cfg.num_attention_heads,
                                    num_kv_heads=cfg.num_key_value_heads,
                                    head_dim=cfg.head_dim, intermediate=cfg.intermediate_size,
                                    eps=cfg.rms_norm_eps, cos_cache=m.rotary.cos_cache,
                                    sin_cache=m.rotary.sin_cache, modules=tuple(modules),
                                    head=head)

    #: when set (speculative drafts that read the target's hidden states), every forward
    #: writes each new token's features at its KV slot: ``sink.layers`` empty: the final
    #: normed hidden state; else the inputs of those layers (the number of layers: the final
    #: normed state), concatenated in layer order
    feature_sink: Any = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        weight = self.model.embed_tokens.weight
        if self.row_by_row:
            return rowwise(lambda row: dense_linear(row, weight), hidden)
        return dense_linear(hidden, weight)

    # ------------------------------------------------------------------ weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (HF names) into the parameters; every parameter must be set.

        ``model.rotary.freq_factors`` (from GGUF ``rope_freqs``) adjusts RoPE. A parameter may
        carry ``weight_loader(param, tensor, shard_offset, shard_size)`` (quantized layouts; it
        also receives :class:`PackedWeight` blocks as they are); otherwise fused shards are row
        slices of the dense weight (a fused :class:`Linear`'s ``shards``), and packed blocks are
        dequantized first. Routed experts arrive per expert (``mlp.experts.3.gate_proj``,
        Mixtral's ``block_sparse_moe.experts.3.w1``) or stacked (``mlp.experts.gate_up_proj``);
        a weight-only format's per-expert tensors (``experts.3.gate_proj.qweight``...) go
        through the format and are dequantized into the stacked experts.
        """
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        self.kv_scales: dict[str, float] = {}
        #: quantized expert projections still missing tensors (see _load_quantized_expert)
        self._pending_experts: dict[str, Linear] = {}
        needed = {name: self._pieces(modules, name) for name in params}
        loaded: dict[str, set[int]] = {name: set() for name in params}
        for name, tensor in self._with_head_copy(weights):
            if name == "model.rotary.freq_factors":
                self.model.rotary.set_freq_factors(tensor)
                continue
            if (name.startswith("lm_head.") and self.lm_head is None) or "rotary_emb" in name:
                continue
            if _KV_SCALE.search(name):
                self.kv_scales[name] = float(tensor.float().max())  # per-layer fp8 KV scales
                continue
            name = name.replace(".block_sparse_moe.", ".mlp.")
            expert = _EXPERT_NAME.match(name)
            if expert is not None:
                target, pieces = self._load_expert(modules, name, expert, tensor)
                loaded[target].update(pieces)
                continue
            target, shard, offset, size = name, 0, 0, None
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in _FUSED:
                fused, shard = _FUSED[parts[-2]]
                owner = ".".join(parts[:-2] + [fused])
                sizes = getattr(modules.get(owner), "shards", None)
                if sizes is not None:
                    offset, size = sum(sizes[:shard]), sizes[shard]
                    target = owner + "." + parts[-1]
            param = params.get(target)
            if param is None:
                raise ConfigError(f"checkpoint tensor {name!r} matches no parameter of "
                                  f"{self.config.architecture}")
            _copy_into(param, name, tensor, offset, size)
            loaded[target].add(shard)
        if self._pending_experts:
            key, layer = next(iter(self._pending_experts.items()))
            lacking = [n for n, _ in layer.named_parameters() if n not in layer.loaded]
            raise ConfigError(f"checkpoint lacks {', '.join(lacking)} of {key} (and "
                              f"{len(self._pending_experts) - 1} other quantized expert "
                              "projections are incomplete)")
        missing = sorted(n for n, k in needed.items()
                         if len(loaded[n]) < k and not getattr(params[n], "optional", False))
        if missing:
            raise ConfigError(f"checkpoint lacks tensors for {len(missing)} parameters, e.g. "
                              f"{', '.join(missing[:3])}")

    @staticmethod
    def _pieces(modules: dict[str, nn.Module], param: str) -> int:
        """How many checkpoint tensors fill parameter ``param``."""
        owner, _, leaf = param.rpartition(".")
        module = modules.get(owner)
        if isinstance(module, ExpertWeights):
            return module.expected(leaf)
        shards = getattr(module, "shards", None)
        return 1 if shards is None else len(shards)

    def _load_expert(self, modules: dict[str, nn.Module], name: str, match: "re.Match[str]",
                     tensor: Any) -> tuple[str, list[int]]:
        owner = match.group(1) + ".experts"
        experts = modules.get(owner)
        if not isinstance(experts, ExpertWeights):
            raise ConfigError(f"checkpoint tensor {name!r}: layer {match.group(1)} of "
                              f"{self.config.architecture} has no routed experts in this config")
        if match.group(2) is not None:
            kind = _EXPERT.get(match.group(3))
            if kind is None:
                raise ConfigError(f"checkpoint tensor {name!r}: unknown expert projection")
            param, shard = kind
            if getattr(experts, "quant", None) is not None:
                return f"{owner}.{param}", self._load_quantized_expert(
                    experts, name, int(match.group(2)), match.group(3), match.group(4), tensor)
            if match.group(4) != "weight":
                raise ConfigError(f"checkpoint tensor {name!r}: a quantized expert tensor, but "
                                  "the checkpoint's method leaves this layer's experts dense")
            if isinstance(tensor, PackedWeight):
                tensor = tensor.dequantize()
            pieces = experts.load(param, tensor, int(match.group(2)), shard)
        else:
            if isinstance(tensor, PackedWeight):
                tensor = tensor.dequantize()
            param = _STACKED.get(match.group(5))
            if param is None:
                raise ConfigError(f"checkpoint tensor {name!r}: unknown stacked expert tensor")
            pieces = experts.load(param, tensor, None, 0)
        return f"{owner}.{param}", pieces

    def _load_quantized_expert(self, experts: ExpertWeights, name: str, expert: int,
                               proj: str, leaf: str, tensor: Any) -> list[int]:
        """One tensor of a quantized expert projection: it loads into a :class:`Linear` of the
        format (``experts.quant`` of the projection's name); once that layer has all its
        tensors it is dequantized and the dense matrix goes into the stacked experts. Returns
        the pieces filled (none until the projection is complete)."""
        param, shard = _EXPERT[proj]
        key = f"{experts.name}.{expert}.{proj}"
        pending = self._pending_experts
        layer = pending.get(key)
        if layer is None:
            h, inter = experts.hidden_size, experts.intermediate_size
            n_in, n_out = (h, inter) if param == "w13" else (inter, h)
            layer = Linear(n_in, n_out, dtype=experts.w13.dtype, quant_method=experts.quant(key))
            layer.loaded = set()
            pending[key] = layer
        p = dict(layer.named_parameters()).get(leaf)
        if p is None:
            raise ConfigError(f"checkpoint tensor {name!r} matches no tensor of the "
                              f"{type(layer.quant_method).__name__} format")
        _copy_into(p, name, tensor)
        layer.loaded.add(leaf)
        if any(n not in layer.loaded and not getattr(q, "optional", False)
               for n, q in layer.named_parameters()):
            return []
        del pending[key]
        return experts.load(param, layer.quant_method.expert_weight(layer), expert, shard)

    def _with_head_copy(self, weights: Iterable[tuple[str, object]]
                        ) -> Iterable[tuple[str, object]]:
        for name, tensor in weights:
            yield name, tensor
            if self.head_copies_embedding and name == "model.embed_tokens.weight":
                yield "lm_head.weight", tensor

    def process_weights_after_loading(self) -> None:
        """Let every linear layer's quant method, the embeddings, and the MoE runner for every
        sparse layer, repack its weights (once, after loading)."""
        for module in self.modules():
            if isinstance(module, (Linear, Embedding)):
                module.process_weights_after_loading()
            elif isinstance(module, SparseMoeBlock):
                module.runner.process_weights_after_loading(module.experts)
