"""The attention family's interface, and the paged KV pool it reads and writes.

A backend is built once per model runner (hook ``engine_create_attention_backend``). Per forward,
the runner calls ``prepare(batch)`` once, then for every layer ``forward(q, k, v, layer, batch)``,
which writes the new tokens' K/V into the pool at ``batch.out_cache_loc`` and returns the
attention output. Shapes: ``q`` [T, Hq, D]; ``k``/``v`` [T, Hkv, D]; output [T, Hq, D].
Causality: new token ``j`` of request ``i`` (position ``prefix_lens[i] + j``) attends to every
cached token of that request and to new tokens ``0..j``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from engine.runtime.batch import Batch


@dataclass
class AttentionLayerSpec:
    """What a backend needs to know about one attention layer."""

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


class KVPool:
    """K and V buffers of every layer, indexed by token slot: ``k[layer]`` is [slots, Hkv, D].

    Slot 0 is reserved as a padding target (never handed out), so a padded batch can write there
    harmlessly. Pages are ``page_size`` consecutive slots; the allocator (in the scheduler) hands
    out whole pages.
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int,
                 page_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.page_size, self.dtype, self.device = page_size, dtype, device
        self.num_slots = num_slots
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, loc, k.to(self.dtype))
        self.v[layer].index_copy_(0, loc, v.to(self.dtype))

    @property
    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


class AttentionBackend(ABC):
    """One attention implementation. Subclasses state their own constraints in their manifest."""

    #: True when decode forwards can be captured in a CUDA graph (see :meth:`prepare_graph`)
    supports_cuda_graph: bool = False
    #: True when extend forwards honour ``batch.tree_mask`` (speculative tree verify); a
    #: backend without it can verify chains only (plain causal extend)
    supports_tree_verify: bool = False

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def prepare(self, batch: Batch) -> None:
        """Build per-batch metadata into ``batch.attn_metadata`` (once per forward)."""

    def prepare_graph(self, batch: Batch) -> None:
        """Metadata for a decode batch that is captured once and replayed for every later
        decode batch of the same size: it may depend only on the batch size and on device
        tensors the runner refreshes in place (``seq_lens``, ``req_pool_indices``,
        ``req_to_token``...), never on Python values of one step."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: AttentionLayerSpec, batch: Batch) -> torch.Tensor:
        self.pool.write(layer.layer_id, batch.out_cache_loc, k, v)
        if batch.is_decode:
            return self.forward_decode(q, layer, batch)
        return self.forward_extend(q, layer, batch)

    @abstractmethod
    def forward_extend(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        """New tokens attend to their cached prefix and, causally, to themselves."""

    @abstractmethod
    def forward_decode(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        """One token per request attends to all of its cached tokens (itself included)."""
