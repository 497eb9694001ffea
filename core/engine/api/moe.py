"""The MoE families' interfaces (hooks ``engine_create_moe_runner``, ``engine_create_moe_a2a``).

A sparse layer of a served model (:mod:`engine.models.moe`) routes each token to its top-k
experts and hands the work to two products, neither of which the layer names:

* the **runner** (``--moe-runner-backend``) computes ``sum_k w_k * expert_k(x)`` for the tokens
  and experts it is given, reading the layer's stacked expert weights (:class:`ExpertWeights`);
* the **all-to-all** (``--moe-a2a-backend``) moves tokens to the ranks owning their experts and
  back (``none``: every expert is local, so dispatch and combine are the identity).

``torch_reference`` below is the float32 definition every runner is checked against (the
conformance kit, ``engine plugins check``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from engine.models.moe import ExpertWeights, route, torch_reference
from engine.runtime.fused_cpu import moe_experts as cpu_expert_products
from engine.runtime.fused_cpu import moe_routed as cpu_routed_experts
from engine.runtime.linear import dense_linear

__all__ = ["ExpertWeights", "LocalAllToAll", "MoEAllToAll", "MoERunner", "cpu_expert_products",
           "cpu_routed_experts", "dense_linear", "route", "torch_reference"]


class MoERunner(ABC):
    """Routed experts of the sparse layers: tokens + their top-k experts -> combined output.

    One runner serves every sparse layer of a model. ``supports`` is asked once per layer at
    load time; ``process_weights_after_loading`` may repack a layer's weights once (keeping
    them in ``experts``' attributes); ``apply`` is the hot path.
    """

    #: ``apply`` can be captured in a CUDA graph (no host sync, fixed launch shapes per batch)
    supports_cuda_graph: bool = False
    #: a token's output does not depend on the other tokens of the batch (bit for bit)
    batch_invariant: bool = False

    def supports(self, experts: ExpertWeights) -> str | None:
        """``None`` when this runner can serve ``experts`` (dtype, device, layout), else the
        reason it cannot (start-up then fails with it)."""
        return None

    def process_weights_after_loading(self, experts: ExpertWeights) -> None:
        """Repack the loaded weights once (default: nothing)."""

    @abstractmethod
    def apply(self, experts: ExpertWeights, hidden: torch.Tensor, topk_ids: torch.Tensor,
              topk_weights: torch.Tensor) -> torch.Tensor:
        """``hidden`` [T, H]; ``topk_ids`` [T, k] int (ids local to ``experts``; -1: an expert
        another rank serves, contributing nothing here); ``topk_weights`` [T, k] float32, as the
        model's router defines them. Returns ``sum_k w_k * expert_k(hidden)`` [T, H] in
        ``hidden``'s dtype, ``expert(x) = w2 @ (silu(gate(x)) * up(x))`` with ``gate``/``up``
        the two halves of ``w13``."""

    def apply_residual(self, experts: ExpertWeights, hidden: torch.Tensor,
                       topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where the runner can add the residual stream in its own last kernel: (``apply``'s
        output + ``residual`` [T, H], the sum rounded to ``hidden``'s dtype and then the total,
        as the model's separate add rounds; the float32 sums of squares of each output row's
        pieces [T, P], from which the next layer's first product norms its input). The
        default, None: the model adds (a kernel of its own)."""
        return None


class MoEAllToAll(ABC):
    """Token movement across expert-parallel ranks around a :class:`MoERunner`.

    ``dispatch`` returns what the runner computes on (hidden rows, top-k ids local to this
    rank's experts, top-k weights) and a handle; ``combine`` turns the runner's output back
    into this rank's tokens, weighted and summed over their experts.
    """

    #: experts of the model owned by this rank: ``range(first_expert, first_expert + n)``
    first_expert: int = 0
    #: dispatch and combine are the identity (every expert local): the runner's output is the
    #: layer's, so the runner may add the residual to it (``MoERunner.apply_residual``)
    identity: bool = False

    @abstractmethod
    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                      torch.Tensor, Any]:
        """(hidden, local topk ids, topk weights, handle) for the runner."""

    @abstractmethod
    def combine(self, expert_output: torch.Tensor, handle: Any) -> torch.Tensor:
        """This rank's tokens' outputs [T, H] from the runner's output."""

    def local_experts(self, num_experts: int) -> range:
        """The expert ids (of ``num_experts``) whose weights this rank loads."""
        return range(num_experts)


class LocalAllToAll(MoEAllToAll):
    """Every expert on this rank (ep = 1): dispatch and combine are the identity."""

    identity = True

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                      torch.Tensor, Any]:
        return hidden, topk_ids, topk_weights, None

    def combine(self, expert_output: torch.Tensor, handle: Any) -> torch.Tensor:
        return expert_output

