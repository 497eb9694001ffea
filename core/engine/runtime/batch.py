"""The one batch object on the hot path: built by the scheduler, read by the model runner, the
attention backend (which fills ``attn_metadata``), the sampler and future families (speculative
verification adds draft tokens as extend tokens; MoE and quantization never need more than the
hidden states).

Layout of a forward over ``B`` requests with ``T`` new tokens in total:

* ``input_ids``/``positions``/``out_cache_loc`` have one entry per new token, requests
  concatenated in batch order (``extend_lens[i]`` tokens for request ``i``; 1 each in decode).
* ``prefix_lens[i]`` tokens of request ``i`` are already in the KV pool (radix-cache hit or
  earlier chunks); ``seq_lens[i] = prefix_lens[i] + extend_lens[i]``.
* The KV slots of request ``i`` are ``req_to_token[req_pool_indices[i], :seq_lens[i]]`` (slot
  indices into the pool's token dimension); the new tokens' slots are ``out_cache_loc`` and are
  already written into that table when the batch is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch


class ForwardMode(Enum):
    EXTEND = "extend"  #: prefill or a prefill chunk: new tokens attend to prefix + themselves
    DECODE = "decode"  #: one new token per request


@dataclass
class Batch:
    mode: ForwardMode
    input_ids: torch.Tensor  #: [T] int64
    positions: torch.Tensor  #: [T] int64
    out_cache_loc: torch.Tensor  #: [T] int64, KV slot per new token
    req_pool_indices: torch.Tensor  #: [B] int64, rows of req_to_token
    seq_lens: torch.Tensor  #: [B] int64, tokens in KV after this forward
    prefix_lens: torch.Tensor  #: [B] int64, tokens already in KV before it
    extend_lens: torch.Tensor  #: [B] int64, new tokens per request
    req_to_token: torch.Tensor  #: [max_requests, max_context] int64 (the pool's table)
    #: python copies of the small per-request vectors, so the CPU never syncs with the device
    seq_lens_cpu: list[int] = field(default_factory=list)
    prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_lens_cpu: list[int] = field(default_factory=list)
    #: indices into the [T] token dimension whose logits are wanted (last token of each request
    #: whose chunk completes its prompt, or every decode token)
    logits_indices: torch.Tensor | None = None
    #: the attention backend's own per-batch data (set by ``AttentionBackend.prepare``)
    attn_metadata: Any = None
    #: sampling parameters of the requests, in batch order (scheduler-owned)
    sampling: Any = None

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.mode is ForwardMode.DECODE
