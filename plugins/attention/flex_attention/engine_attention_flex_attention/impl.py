"""flex_attention: paged attention through ``torch.nn.attention.flex_attention``.

How the paged layout becomes a block mask (built once per forward in ``prepare``):

* The batch's KV slots are packed request after request: ``kv_slots`` [S] holds
  ``req_to_token[row_i, :seq_len_i]`` for each request ``i`` (S = sum of the context lengths),
  with two small tables per key, ``kv_req`` (its request) and ``kv_pos`` (its position in the
  request), and two per query token, ``q_req`` and ``q_pos`` (``prefix_len + j``). They are built
  from the CPU copies of the lengths and copied to the device (no device sync).
* ``mask_mod(b, h, q, kv) = q_req[q] == kv_req[kv] and kv_pos[kv] <= q_pos[q]``: causal within a
  request, nothing across requests; ``create_block_mask`` turns it into a block-sparse mask so
  blocks belonging to other requests are skipped (on CUDA, where flex is compiled).
* Each layer gathers its K/V once (``index_select`` of ``kv_slots`` on the pool) into
  [1, Hkv, S, D] and calls flex_attention with ``enable_gqa``; the queries are [1, Hq, T, D].

Only slots the batch owns are read. Mapping logical to physical indices inside ``mask_mod``
over the whole pool would avoid the gather, but then every block touched would also read the
value rows of slots owned by nobody (0 x NaN poisons the output), and the pool-sized key axis
makes CPU's unfused path quadratic in the pool; the gather is the honest choice.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from engine.api import hookimpl
from engine.api.attention import AttentionBackend, AttentionLayerSpec, KVPool
from engine.api.attention import Batch

# CPU runs flex's documented eager path on purpose; its one-time advice to compile is noise here
warnings.filterwarnings("ignore", message=r".*flex_attention called without torch\.compile.*")


@dataclass
class Metadata:
    kv_slots: torch.Tensor  #: [S] pool slots of every request's context, packed
    block_mask: BlockMask


class FlexAttentionBackend(AttentionBackend):
    """See the module docstring."""

    supports_fp8_kv_cache = True  # K/V read through pool.gather
    supports_fp4_kv_cache = True  # (likewise)

    def __init__(self, pool: KVPool) -> None:
        super().__init__(pool)
        self._attend: Callable[..., torch.Tensor] = flex_attention
        if pool.device.type == "cuda":
            self._attend = torch.compile(flex_attention, dynamic=True)

    def prepare(self, batch: Batch) -> None:
        dev = batch.seq_lens.device
        seq = batch.seq_lens_cpu or batch.seq_lens.tolist()
        ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
        pre = batch.prefix_lens_cpu or batch.prefix_lens.tolist()
        longest = max(seq)
        seq_t, ext_t = torch.tensor(seq), torch.tensor(ext)
        req = torch.arange(len(seq))
        kv_req = req.repeat_interleave(seq_t)
        kv_pos = torch.cat([torch.arange(n) for n in seq])
        q_req = req.repeat_interleave(ext_t)
        q_pos = torch.cat([torch.arange(p, p + e) for p, e in zip(pre, ext)])
        rows = batch.req_to_token.index_select(0, batch.req_pool_indices)[:, :longest]
        flat = (kv_req * longest + kv_pos).to(dev, non_blocking=True)
        kv_slots = rows.reshape(-1).index_select(0, flat)
        kv_req, kv_pos = kv_req.to(dev), kv_pos.to(dev)
        q_req, q_pos = q_req.to(dev), q_pos.to(dev)

        def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return (q_req[q] == kv_req[kv]) & (kv_pos[kv] <= q_pos[q])

        mask = create_block_mask(mask_mod, None, None, len(q_req), len(kv_req), device=dev)
        batch.attn_metadata = Metadata(kv_slots, mask)

    def _run(self, q: torch.Tensor, layer: AttentionLayerSpec, md: Metadata) -> torch.Tensor:
        k, v = self.pool.gather(layer.layer_id, md.kv_slots, q.dtype)
        out = self._attend(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                           v.transpose(0, 1).unsqueeze(0), block_mask=md.block_mask,
                           scale=layer.scaling,
                           enable_gqa=layer.num_q_heads != layer.num_kv_heads)
        return out.squeeze(0).transpose(0, 1)

    def forward_extend(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        return self._run(q, layer, batch.attn_metadata)

    def forward_decode(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        return self._run(q, layer, batch.attn_metadata)


@hookimpl
def engine_create_attention_backend(pool: KVPool, model_config: Any, config: Any) -> Any:
    return FlexAttentionBackend(pool)
