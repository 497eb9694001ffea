"""The one batch object on the hot path: built by the scheduler, read by the model runner, the
attention backend (which fills ``attn_metadata``), the sampler and the speculative verify step
(draft tokens are extend tokens; MoE and quantization never need more than the hidden states).

Layout of a forward over ``B`` requests with ``T`` new tokens in total:

* ``input_ids``/``positions``/``out_cache_loc`` have one entry per new token, requests
  concatenated in batch order (``extend_lens[i]`` tokens for request ``i``; 1 each in decode).
* ``prefix_lens[i]`` tokens of request ``i`` are already in the KV pool (radix-cache hit or
  earlier chunks); ``seq_lens[i] = prefix_lens[i] + extend_lens[i]``.
* The KV slots of request ``i`` are ``req_to_token[req_pool_indices[i], :seq_lens[i]]`` (slot
  indices into the pool's token dimension); the new tokens' slots are ``out_cache_loc`` and are
  already written into that table when the batch is built.
* A speculative *verify* batch is an ``EXTEND`` batch whose new tokens of request ``i`` are its
  last verified token followed by its draft nodes. For a chain, positions are consecutive and
  plain causal attention is right. For a tree, ``tree_mask`` says which of its own new tokens
  each new token sees (its ancestors and itself) and ``positions`` are ``prefix + depth``;
  key ``prefix_lens[i] + j`` is still new token ``j`` (slots in index order in ``req_to_token``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch


class ForwardMode(Enum):
    EXTEND = "extend"  #: prefill or a prefill chunk: new tokens attend to prefix + themselves
    DECODE = "decode"  #: one new token per request
    #: speculative verify: each request's last token and its draft nodes (an extend batch for
    #: the attention backend, with ``tree_mask`` for trees)
    VERIFY = "verify"


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
    #: decode batches a CUDA graph replays: the sampling kernel's parameters, [6, B] int64 on
    #: the device (:func:`engine.runtime.sampling.sample_lists`), so that the graph draws the
    #: tokens too; None: its rows are drawn greedily there
    sample_args: torch.Tensor | None = None
    #: set by the graph replay: the tokens the sampling kernel drew inside the graph [B]
    drawn_ids: torch.Tensor | None = None
    #: tree verify only: [B, Q, Q] bool, Q = max(extend_lens); ``tree_mask[i, j, k]``: new token
    #: ``j`` of request ``i`` attends to its new token ``k`` (rows beyond ``extend_lens[i]`` are
    #: padding). None: plain causal attention among the new tokens. Only backends that declare
    #: ``supports_tree_verify`` ever receive one.
    tree_mask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.mode is ForwardMode.DECODE

    def logits_rows(self) -> torch.Tensor:
        """The rows whose logits are wanted: :attr:`logits_indices`, or each request's last."""
        if self.logits_indices is not None:
            return self.logits_indices
        return torch.cumsum(self.extend_lens, 0) - 1


def to_device(values: list[int] | list[float] | torch.Tensor, device: torch.device,
              dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values as a tensor on ``device``, copied without waiting for the work already
    queued there (on a GPU through a pinned staging buffer: a copy from pageable memory may
    wait for the stream). On CPU the tensor itself."""
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return t
    staging = getattr(_staging, "ring", None)
    if staging is None:
        staging = _staging.ring = PinnedStaging()
    return staging.to_device(t, device)


def pack_to_device(parts: list[list[int]], device: torch.device
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Several small integer vectors in one host-to-device copy (:func:`to_device`), split into
    views on ``device`` (and the same views of the host tensor). Each view starts 16-byte
    aligned: Triton specialises a kernel on its pointers' alignment, and an offset whose parity
    follows the batch's sizes would compile new variants while serving."""
    values: list[int] = []
    for part in parts:
        values += part
        if len(part) % 2:
            values.append(0)
    host = torch.tensor(values, dtype=torch.long)
    flat = to_device(host, device)
    padded = [len(part) + len(part) % 2 for part in parts]
    return ([view[:len(part)] for view, part in zip(flat.split(padded), parts)],
            [view[:len(part)] for view, part in zip(host.split(padded), parts)])


_staging = threading.local()  #: one staging ring per thread that copies


class PinnedStaging:
    """Pinned host buffers used in turn for host-to-device copies: a buffer is written again
    only after the copy out of it has completed (its event), so a copy never waits for the
    device and no pinned memory is allocated per copy once the buffers have grown."""

    SLOTS = 8

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * self.SLOTS
        self.events: list[Any] = [None] * self.SLOTS
        self.next = 0

    def to_device(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        k, self.next = self.next, (self.next + 1) % self.SLOTS
        if self.events[k] is not None:
            self.events[k].synchronize()  # copied long ago, normally
        nbytes = t.numel() * t.element_size()
        buf = self.buffers[k]
        if buf is None or buf.numel() < nbytes:
            buf = self.buffers[k] = torch.empty(max(4096, 1 << (nbytes - 1).bit_length()),
                                                dtype=torch.uint8, pin_memory=True)
        staged = buf[:nbytes].view(t.dtype).view(t.shape)
        staged.copy_(t)
        out = staged.to(device, non_blocking=True)
        if self.events[k] is None:
            self.events[k] = torch.cuda.Event()
        self.events[k].record()
        return out
