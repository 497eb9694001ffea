"""Sparse (mixture-of-experts) layers: the router, the stacked expert weights, and the block that
hands the expert work to the chosen runner and all-to-all (:mod:`engine.api.moe`).

Router semantics are the checkpoints' own (as transformers computes them): softmax over the
router logits in float32, top-k, renormalised over the k when the config says so; Qwen2-MoE adds
a shared expert scaled by ``sigmoid(shared_expert_gate(x))``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ConfigError
from engine.runtime.linear import ActQuant, dense_linear, exact_16bit

if TYPE_CHECKING:
    from engine.api.moe import MoEAllToAll, MoERunner
    from engine.models.config import ModelConfig


def route(router_logits: torch.Tensor, top_k: int,
          renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights float32 [T, k], topk_ids int32 [T, k]) from router logits [T, E] (one
    fused kernel on a GPU in half precision)."""
    from engine.runtime import fused

    if router_logits.dim() == 2 and fused.enabled(router_logits):
        return fused.route_topk(router_logits, top_k, renormalize)
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def torch_reference(w13: torch.Tensor, w2: torch.Tensor, hidden: torch.Tensor,
                    topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    act: ActQuant | None = None) -> torch.Tensor:
    """The definition, in float32: ``sum_k w_k * w2[e_k] @ act[1](silu(g) * u)`` with
    ``[g; u] = w13[e_k] @ act[0](x)`` (``act``: :attr:`ExpertWeights.act_quant`; none by
    default); ids of -1 contribute nothing. Returns [T, H] in float32."""
    act_in, act_mid = act or (lambda rows: rows, lambda rows: rows)
    x = act_in(hidden.float())
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    flat_ids = topk_ids.reshape(-1).long()
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_w = topk_weights.reshape(-1).float()
    for e in flat_ids.unique().tolist():
        if e < 0:
            continue
        sel = (flat_ids == e).nonzero().squeeze(1)
        gu = x[token[sel]] @ w13[e].float().t()
        mid = act_mid(F.silu(gu[:, :inter]) * gu[:, inter:])
        out.index_add_(0, token[sel], (mid @ w2[e].float().t()) * flat_w[sel, None])
    return out


class ExpertWeights(nn.Module):
    """The routed experts of one layer, stacked: ``w13`` [E, 2I, H] (gate rows, then up rows)
    and ``w2`` [E, H, I] in the model dtype. ``first_expert``: the model-wide id of row 0 (expert
    parallelism loads a slice). Runners may keep repacked copies as extra attributes.

    ``act_quant``: an activation-quantized format's rounding of the rows each expert multiplies
    (:data:`~engine.runtime.linear.ActQuant`: ``x`` before ``w13``, ``silu(g) * u`` before ``w2``); ``None``: none. A
    runner applies it or refuses the layer in ``supports``."""

    act_quant: ActQuant | None = None

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 dtype: torch.dtype, *, first_expert: int = 0, model_num_experts: int = 0,
                 name: str = "") -> None:
        super().__init__()
        self.model_num_experts = model_num_experts or first_expert + num_experts
        self.num_experts, self.hidden_size = num_experts, hidden_size
        self.intermediate_size, self.first_expert, self.name = intermediate_size, first_expert, name
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size,
                                            dtype=dtype), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size,
                                           dtype=dtype), requires_grad=False)

    def keep_16bit_on_cpu(self) -> bool:
        """Keep float32 CPU experts whose values are all bfloat16 (or half) values in that type
        (a 16-bit checkpoint served in float32: half the bytes), for a runner whose products
        read them (the core's CPU expert kernels widen them exactly as they read). Whether it
        did; ``ENGINE_CPU_HALF_WEIGHTS=0``: never (:func:`exact_16bit`)."""
        narrow = exact_16bit(self.w13.data, self.w2.data)
        if narrow is None:
            return False
        self.w13 = nn.Parameter(narrow[0], requires_grad=False)
        self.w2 = nn.Parameter(narrow[1], requires_grad=False)
        return True

    def expected(self, param: str) -> int:
        """How many checkpoint pieces fill ``param`` (per-expert gate and up, or down)."""
        return self.num_experts * (2 if param == "w13" else 1)

    def load(self, param: str, tensor: torch.Tensor, expert: int | None,
             shard: int) -> list[int]:
        """Copy one checkpoint tensor in; returns the piece ids it filled.

        ``expert`` None: a stacked tensor of every expert (``experts.gate_up_proj`` [E, 2I, H] or
        ``experts.down_proj`` [E, H, I]); else expert ``expert``'s ``gate`` (shard 0), ``up``
        (shard 1) or ``down`` (``param`` "w2") matrix. Experts other ranks own are skipped.
        """
        dst = getattr(self, param).data
        if expert is None:
            want = (dst.shape[0] + self.first_expert, *dst.shape[1:])
            if tuple(tensor.shape) != want:
                raise ConfigError(f"{self.name}: stacked expert tensor for {param} has shape "
                                  f"{tuple(tensor.shape)}, expected {want}")
            dst.copy_(tensor[self.first_expert:self.first_expert + dst.shape[0]])
            return list(range(self.expected(param)))
        if not 0 <= expert < self.model_num_experts:
            raise ConfigError(f"{self.name}: the checkpoint has expert {expert}, the config "
                              f"says {self.model_num_experts} experts")
        local = expert - self.first_expert
        if not 0 <= local < self.num_experts:
            return []
        inter = self.intermediate_size
        target = dst[local] if param == "w2" else dst[local].narrow(0, shard * inter, inter)
        if tuple(tensor.shape) != tuple(target.shape):
            what = ("down", "gate", "up")[0 if param == "w2" else 1 + shard]
            raise ConfigError(f"{self.name}: expert {expert} {what} projection has shape "
                              f"{tuple(tensor.shape)}, expected {tuple(target.shape)} "
                              "(hidden size / expert width of the config)")
        target.copy_(tensor)
        return [local * (1 if param == "w2" else 2) + (0 if param == "w2" else shard)]

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden_size}, "
                f"inter={self.intermediate_size}, dtype={self.w13.dtype}")


class SparseMoeBlock(nn.Module):
    """Router + routed experts (+ an optional shared expert). ``forward(x [T, H]) -> [T, H]``."""

    def __init__(self, cfg: "ModelConfig", layer_id: int, dtype: torch.dtype, *,
                 runner: "MoERunner", a2a: "MoEAllToAll", shared: nn.Module | None,
                 prefix: str,
                 act_quant: ActQuant | None = None) -> None:
        super().__init__()
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        if not 0 < self.top_k <= cfg.num_experts:
            raise ConfigError(f"num_experts_per_tok {self.top_k} must be in 1..{cfg.num_experts}")
        local = a2a.local_experts(cfg.num_experts)
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False, dtype=dtype)
        self.gate.weight.requires_grad_(False)
        self.experts = ExpertWeights(len(local), cfg.hidden_size, cfg.moe_intermediate_size,
                                     dtype, first_expert=local.start,
                                     model_num_experts=cfg.num_experts, name=prefix + ".experts")
        self.experts.act_quant = act_quant
        self.shared_expert = shared
        self.shared_expert_gate = None
        if shared is not None and cfg.shared_expert_gate:
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False, dtype=dtype)
            self.shared_expert_gate.weight.requires_grad_(False)
        self.runner, self.a2a = runner, a2a
        reason = runner.supports(self.experts)
        if reason:
            raise ConfigError(f"--moe-runner-backend: cannot serve {self.experts.name}: {reason}")

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights float32 [T, k], ids int32 [T, k]) of the router's logits."""
        return route(router_logits, self.top_k, self.renormalize)

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor,
                         routed: tuple[torch.Tensor, torch.Tensor]
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(``forward(x, routed=routed) + residual``, the sums of squares of its rows' pieces)
        where the runner adds the residual in its own last kernel (its ``apply_residual``; no
        shared expert, every expert local), else None."""
        if self.shared_expert is not None or not getattr(self.a2a, "identity", False):
            return None
        weights, ids = routed
        return self.runner.apply_residual(self.experts, x, ids, weights, residual)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor | None = None,
                routed: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``router_logits``: the router's product of ``x`` where the caller made it (the
        chained sparse layer: in the kernel that normed ``x``); ``routed``: its (weights,
        ids) too, as :meth:`route` makes them (the chained layer routes before it asks the
        runner whether it adds the residual itself)."""
        if routed is not None:
            weights, ids = routed
        else:
            # the router through the model's own few-row product (on a GPU the Triton
            # matrix-vector kernel, which launches with its neighbours under PDL)
            logits = (dense_linear(x, self.gate.weight) if router_logits is None
                      else router_logits)
            weights, ids = self.route(logits)
        h, local_ids, local_w, handle = self.a2a.dispatch(x, ids, weights)
        out = self.a2a.combine(self.runner.apply(self.experts, h, local_ids, local_w), handle)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


def moe_parts(model: nn.Module) -> list[SparseMoeBlock]:
    return [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
