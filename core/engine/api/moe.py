"""The MoE families' interfaces (hooks ``engine_create_moe_runner``, ``engine_create_moe_a2a``).

These families are declared and their plugins listed, but no architecture the runtime serves
has routed experts yet, so choosing one at ``engine serve`` is refused until it does. The
contracts below are what a runner or dispatcher will be handed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class MoERunner(ABC):
    """Routed experts of one MoE layer: tokens + their top-k experts -> the combined output."""

    @abstractmethod
    def create_weights(self, layer: Any, *, num_experts: int, hidden_size: int,
                       intermediate_size: int, dtype: Any) -> None:
        """Register the stacked expert parameters on ``layer`` (``w13`` gate+up
        ``[E, 2*I, H]``, ``w2`` down ``[E, H, I]``), each with a ``weight_loader``."""

    def process_weights_after_loading(self, layer: Any) -> None:
        """Repack the loaded weights once (default: nothing)."""

    @abstractmethod
    def apply(self, layer: Any, hidden: Any, topk_ids: Any, topk_weights: Any) -> Any:
        """``hidden`` [T, H]; ``topk_ids`` [T, k] int; ``topk_weights`` [T, k] float32 (already
        normalised as the model's router defines). Returns ``sum_k w_k * expert_k(hidden)``
        [T, H] in ``hidden``'s dtype, where ``expert(x) = down(silu(gate(x)) * up(x))``."""


class MoEAllToAll(ABC):
    """Token movement across expert-parallel ranks around a :class:`MoERunner`."""

    @abstractmethod
    def dispatch(self, hidden: Any, topk_ids: Any, topk_weights: Any) -> Any:
        """Send each token to the ranks owning its experts; returns what the runner needs."""

    @abstractmethod
    def combine(self, expert_output: Any, handle: Any) -> Any:
        """Bring the experts' outputs back to the tokens' ranks, weighted and summed."""
