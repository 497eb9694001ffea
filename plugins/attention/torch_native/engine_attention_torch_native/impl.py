"""torch_native: the reference paged attention backend.

``prepare`` builds, once per forward, each request's KV slot list from ``req_to_token`` padded to
the longest context ([B, L]) and the boolean mask (causal over prefix + new tokens, padding
off). Each layer then gathers its K/V pages once (one ``index_select`` per layer) and runs one
``scaled_dot_product_attention`` over the padded batch (GQA: decode groups the query heads of one
KV head, extend repeats KV heads). Correct for ragged batches, cached prefixes, decode and any
page size (slots are read one by one). Speculative tree verify: the new tokens' part of the mask
is ``batch.tree_mask`` instead of causal.

On the CPU with a float32 or 16-bit pool, every batch skips the gather and the padding: the
core's C kernel (:func:`engine.api.attention.attend_from_pool`) reads each token's keys from
the pool, one token at a time, so a token's output is the same whether it is decoded,
prefilled or verified as a draft, and whatever else is in the batch (a tree's token reads its
own slot list: the prefix, then its ancestors and itself). An fp8 or fp4 pool takes that kernel
for decode batches only (fp8 scales applied, fp4 rows unpacked there); its prefills stay on the
gathered SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.api import hookimpl
from engine.api.attention import AttentionBackend, AttentionLayerSpec, KVPool
from engine.api.attention import Batch, attend_from_pool, attend_per_token, decode_from_pool
from engine.api.attention import pool_attention_applies


@dataclass
class Metadata:
    kv_index: torch.Tensor  #: [B, L] pool slots (padding -> slot 0)
    mask: torch.Tensor | None  #: [B, 1, Q, L] bool (True: attend), None: attend to all L
    is_causal: bool  #: a single request without prefix: SDPA's own causal mask
    token_index: torch.Tensor | None  #: [T] rows of the padded [B*Q] queries, None if B*Q == T
    num_queries: int  #: Q, new tokens of the longest request


@dataclass
class PoolTokens:
    rows: torch.Tensor  #: [T] row of each new token in ``table``
    lens: torch.Tensor  #: [T] keys each token sees (its position + 1)
    max_len: int
    table: torch.Tensor | None = None  #: slot lists (None: ``batch.req_to_token``)


class TorchNativeBackend(AttentionBackend):
    """SDPA over gathered pages; see the module docstring. ``batch_invariant``
    (``--enable-deterministic-inference``): one SDPA call per token instead
    (:func:`engine.api.attention.attend_per_token`)."""

    supports_fp8_kv_cache = True  # K/V read through pool.gather
    supports_fp4_kv_cache = True  # (likewise)
    pads_extend = True  # every request of an extend batch is padded to the longest

    def __init__(self, pool: KVPool, batch_invariant: bool = False) -> None:
        super().__init__(pool)
        self.batch_invariant = batch_invariant
        # the per-token path attends causally: speculative trees need the batched path's mask
        self.supports_tree_verify = not batch_invariant

    def _from_pool(self, batch: Batch) -> bool:
        # an fp8 or fp4 pool: decode only (its prefills stay on the gathered SDPA, faster over
        # long prompts than the per-token kernel; these pools give no prefill/decode identity)
        return pool_attention_applies(self.pool) and (batch.is_decode or not self.pool.quantized)

    def decodes_from_pool(self, batch: Batch) -> bool:
        return not self.batch_invariant and batch.is_decode and self._from_pool(batch)

    def prepare(self, batch: Batch) -> None:
        batch.attn_metadata = None
        if self.batch_invariant:
            return
        if self._from_pool(batch):
            if batch.tree_mask is not None:
                batch.attn_metadata = self._tree_tokens(batch)
            elif not batch.is_decode:  # each new token: its request's row, keys up to itself
                ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
                rows = torch.repeat_interleave(batch.req_pool_indices,
                                               torch.tensor(ext, dtype=torch.int64))
                batch.attn_metadata = PoolTokens(rows, batch.positions + 1,
                                                 max(batch.seq_lens_cpu or
                                                     batch.seq_lens.tolist()))
            return
        self.prepare_padded(batch)

    @staticmethod
    def _tree_tokens(batch: Batch) -> "PoolTokens":
        """Tree verify from the pool: each new token's own slot list, the cached prefix then
        its ancestors and itself in index order (so a path's keys come in the order a later
        decode of it reads them, and the sums are the same)."""
        seq = batch.seq_lens_cpu or batch.seq_lens.tolist()
        ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
        bsz, ctx, q_len = len(seq), max(seq), batch.tree_mask.shape[1]
        kv_index = batch.req_to_token.index_select(0, batch.req_pool_indices)[:, :ctx]
        keys = torch.arange(ctx)
        rel = keys[None, :] - batch.prefix_lens[:, None]  # [B, L]: new-token index of a key
        seen = batch.tree_mask.gather(
            2, rel.clamp(0, q_len - 1)[:, None, :].expand(bsz, q_len, ctx))
        visible = ((rel < 0)[:, None, :] | (seen & (rel < q_len)[:, None, :])) \
            & (keys[None, :] < batch.seq_lens[:, None])[:, None, :]  # [B, Q, L]
        order = torch.argsort((~visible).to(torch.int8), dim=-1, stable=True)
        table = kv_index[:, None, :].expand(bsz, q_len, ctx).gather(2, order)
        lens = visible.sum(-1)  # [B, Q]
        token = torch.cat([torch.arange(e) + i * q_len for i, e in enumerate(ext)])
        table = table.reshape(bsz * q_len, ctx)[token].contiguous()
        return PoolTokens(torch.arange(len(token)), lens.reshape(-1)[token].contiguous(), ctx,
                          table)

    def prepare_padded(self, batch: Batch) -> None:
        """The padded slot table and mask of the SDPA paths."""
        dev = batch.seq_lens.device
        seq = batch.seq_lens_cpu or batch.seq_lens.tolist()
        ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
        pre = batch.prefix_lens_cpu or batch.prefix_lens.tolist()
        bsz, ctx = len(seq), max(seq)
        kv_index = batch.req_to_token.index_select(0, batch.req_pool_indices)[:, :ctx].contiguous()
        uniform = min(seq) == ctx
        keys = torch.arange(ctx, device=dev)
        valid = None if uniform else keys[None, :] < batch.seq_lens[:, None]
        if valid is not None:
            kv_index = kv_index.masked_fill(~valid, 0)
        if batch.is_decode:
            mask = None if valid is None else valid[:, None, None, :]
            batch.attn_metadata = Metadata(kv_index, mask, False, None, 1)
            return
        q_len = max(ext)
        tree = batch.tree_mask
        if bsz == 1 and pre[0] == 0 and tree is None:
            batch.attn_metadata = Metadata(kv_index, None, True, None, q_len)
            return
        if tree is None:
            q_pos = batch.prefix_lens[:, None] + torch.arange(q_len, device=dev)[None, :]
            mask = keys[None, None, :] <= q_pos[:, :, None]  # [B, Q, L]
        else:  # the cached prefix, then the tree's own ancestors-or-self
            rel = keys[None, :] - batch.prefix_lens[:, None]  # [B, L]: new-token index of a key
            seen = tree.gather(2, rel.clamp(0, q_len - 1)[:, None, :].expand(bsz, q_len, ctx))
            mask = (rel < 0)[:, None, :] | (seen & (rel < q_len)[:, None, :])
        if valid is not None:
            mask = mask & valid[:, None, :]
        token_index = None
        if min(ext) != q_len:
            rows = [torch.arange(e) + i * q_len for i, e in enumerate(ext)]
            token_index = torch.cat(rows).to(dev)
        batch.attn_metadata = Metadata(kv_index, mask[:, None], False, token_index, q_len)

    def _gather(self, layer: AttentionLayerSpec, md: Metadata,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's K and V of every request, [B, Hkv, L, D] (one gather each)."""
        k, v = self.pool.gather(layer.layer_id, md.kv_index, dtype)
        return k.transpose(1, 2), v.transpose(1, 2)

    def _attend(self, q: torch.Tensor, layer: AttentionLayerSpec, md: Metadata) -> torch.Tensor:
        """q [B, Q, Hq, D] -> [B, Q, Hq, D]; KV heads repeated for GQA."""
        k, v = self._gather(layer, md, q.dtype)
        ratio = layer.num_q_heads // layer.num_kv_heads
        if ratio > 1:
            k, v = k.repeat_interleave(ratio, dim=1), v.repeat_interleave(ratio, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=md.mask,
                                             is_causal=md.is_causal, scale=layer.scaling)
        return out.transpose(1, 2)

    def forward_extend(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        if self.batch_invariant:
            return attend_per_token(self.pool, q, layer, batch)
        md = batch.attn_metadata
        if isinstance(md, PoolTokens):
            table = batch.req_to_token if md.table is None else md.table
            return attend_from_pool(self.pool, q.float(), layer, table, md.rows, md.lens,
                                    md.max_len).to(q.dtype)
        bsz, q_len = md.kv_index.shape[0], md.num_queries
        heads, dim = q.shape[1], q.shape[2]
        if md.token_index is None:
            padded = q.view(bsz, q_len, heads, dim)
        else:
            padded = q.new_zeros(bsz * q_len, heads, dim)
            padded.index_copy_(0, md.token_index, q)
            padded = padded.view(bsz, q_len, heads, dim)
        out = self._attend(padded, layer, md).reshape(bsz * q_len, heads, dim)
        return out if md.token_index is None else out.index_select(0, md.token_index)

    def forward_decode(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        """The query heads sharing a KV head attend together as one group of queries (no KV
        repeat): q [B, Hq, D] -> [B, Hkv, ratio, D] against K/V [B, Hkv, L, D]."""
        if self.batch_invariant:
            return attend_per_token(self.pool, q, layer, batch)
        md: Metadata | None = batch.attn_metadata
        if md is None:  # prepare chose the pool kernel
            return decode_from_pool(self.pool, q, layer, batch)
        k, v = self._gather(layer, md, q.dtype)
        bsz = q.shape[0]
        grouped = q.view(bsz, layer.num_kv_heads, -1, layer.head_dim)
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=md.mask,
                                             scale=layer.scaling)
        return out.reshape(bsz, layer.num_q_heads, layer.head_dim)


@hookimpl
def engine_create_attention_backend(pool: KVPool, model_config: Any, config: Any) -> Any:
    return TorchNativeBackend(pool, batch_invariant=config.enable_deterministic_inference)
