"""flashinfer: FlashInfer's paged-KV wrappers over the engine's pool (GPU only).

The pool's per-layer buffers [slots, Hkv, D] are viewed, without a copy, as FlashInfer's "NHD"
paged cache [pages, page_size, Hkv, D] (the pool's slot count is a whole number of pages and a
request's pages are whole pages, so slot ``s`` is row ``s % page_size`` of page
``s // page_size``). ``prepare`` builds the page table once per forward from ``req_to_token`` and
the CPU copies of the lengths:

* ``kv_indptr`` [B+1] (host): running count of each request's pages;
* ``kv_indices`` [pages] (device): ``req_to_token[row, ::page_size] // page_size`` per request;
* ``kv_last_page_len`` [B] (host): tokens in each request's last page (1..page_size);
* extend only: ``qo_indptr`` [B+1] (host): running count of new tokens,

and plans the one wrapper the batch needs (``batch.attn_metadata`` is that wrapper):
``BatchPrefillWithPagedKVCacheWrapper`` (causal, or a
speculative tree's ``custom_mask``;
FlashInfer aligns the queries to the end of each request's keys, i.e. new token ``j`` sees
positions ``<= prefix_len + j``) or ``BatchDecodeWithPagedKVCacheWrapper`` (tensor-core decode).
Every layer then only calls ``run``. Decode forwards can be captured in CUDA graphs: one
decode wrapper per captured batch size over fixed buffers (``use_cuda_graph``), planned before
each replay with the real page table padded to the size (``prepare_replay``), ``run`` captured.
Heads, head dim and scale are planned from the model config;
a layer that differs is refused rather than silently run with another plan.
An fp8 pool (``--kv-cache-dtype fp8_e4m3/fp8_e5m2``) is planned with the pool's dtype as the
KV type and the model's as the query's, on FlashInfer's FA2 kernels (its SM90 FA3 kernels take
fp8 only for the query too); each layer's ``run`` passes that layer's ``k_scale`` (folded into the
softmax scale) and ``v_scale`` (applied to the output; skipped where it is 1).
Written against flashinfer-python 0.5.3: ``plan`` takes the page table and shapes positionally
and the rest by keyword; ``run(q, (k_cache, v_cache), k_scale=, v_scale=)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from engine.api import PluginError
from engine.api import hookimpl
from engine.api.attention import AttentionBackend, AttentionLayerSpec, KVPool
from engine.api.attention import Batch

WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class PlanShape:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


@dataclass
class PageTable:
    kv_indptr: torch.Tensor  #: [B+1] int32, host
    kv_indices: torch.Tensor  #: [pages] int32, device
    kv_last_page_len: torch.Tensor  #: [B] int32, host
    qo_indptr: torch.Tensor | None  #: [B+1] int32, host (extend only)


def page_table(batch: Batch, page_size: int) -> PageTable:
    """The batch's pages in FlashInfer's CSR form (see the module docstring); no device sync."""
    seq = batch.seq_lens_cpu or batch.seq_lens.tolist()
    pages = [-(-n // page_size) for n in seq]
    most = max(pages)
    kv_indptr = torch.zeros(len(seq) + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.tensor(pages).cumsum(0)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(seq, pages)], dtype=torch.int32)
    dev = batch.req_to_token.device
    first_slots = batch.req_to_token.index_select(0, batch.req_pool_indices)[
        :, : most * page_size : page_size]  # [B, most]: first slot of each page
    flat = torch.cat([torch.arange(p) + i * most for i, p in enumerate(pages)])
    kv_indices = (first_slots.reshape(-1).index_select(0, flat.to(dev, non_blocking=True))
                  // page_size).to(torch.int32)
    qo = None
    if not batch.is_decode:
        ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
        qo = torch.zeros(len(ext) + 1, dtype=torch.int32)
        qo[1:] = torch.tensor(ext).cumsum(0)
    return PageTable(kv_indptr, kv_indices, last, qo)


def tree_custom_mask(batch: Batch) -> torch.Tensor:
    """FlashInfer's ``custom_mask`` of a speculative tree verify: per request a row-major
    [new tokens, all its keys] bool block (the prefix all True, then the tree's ancestors and
    self), flattened and concatenated in batch order."""
    ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
    pre = batch.prefix_lens_cpu or batch.prefix_lens.tolist()
    tree = batch.tree_mask
    parts = []
    for i, (e, p) in enumerate(zip(ext, pre)):
        block = torch.ones((e, p + e), dtype=torch.bool, device=tree.device)
        block[:, p:] = tree[i, :e, :e]
        parts.append(block.reshape(-1))
    return torch.cat(parts)


def padded_table(batch: Batch, page_size: int, size: int) -> PageTable:
    """:func:`page_table` of a decode batch padded to ``size`` requests: each padding request
    holds one token, in the reserved page 0 (where the captured graph writes its K/V)."""
    table = page_table(batch, page_size)
    pad = size - batch.batch_size
    if pad <= 0:
        return table
    used = int(table.kv_indptr[-1])
    indptr = torch.cat([table.kv_indptr,
                        torch.arange(used + 1, used + pad + 1, dtype=torch.int32)])
    last = torch.cat([table.kv_last_page_len, torch.ones(pad, dtype=torch.int32)])
    indices = torch.cat([table.kv_indices, table.kv_indices.new_zeros(pad)])
    return PageTable(indptr, indices, last, None)


class FlashInferBackend(AttentionBackend):
    """See the module docstring."""

    supports_tree_verify = True  #: through ``plan(custom_mask=...)``
    #: decode ``run`` is captured; its plan (into fixed buffers) runs before each replay
    supports_cuda_graph = True
    supports_fp8_kv_cache = True  #: planned with fp8 KV, the layer's scales passed to ``run``

    def __init__(self, pool: KVPool, shape: PlanShape) -> None:
        super().__init__(pool)
        import flashinfer

        if pool.num_slots % pool.page_size:
            raise PluginError(f"flashinfer: the KV pool's {pool.num_slots} slots are not a "
                              f"whole number of {pool.page_size}-token pages")
        self.shape = shape
        dev = pool.device
        self._prefill_workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._prefill_workspace, "NHD", backend="fa2" if pool.is_fp8 else "auto")
        #: speculative tree verify: a wrapper of its own on FlashInfer's FA2 kernels (a
        #: wrapper keeps the kernel family its first plan chose, and the SM90 one has no
        #: custom mask); made on first use, over the prefill workspace (one runs at a time)
        self._tree: Any = None
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev), "NHD",
            use_tensor_cores=True)
        #: CUDA graphs: one decode wrapper per captured batch size, over fixed buffers (the
        #: page indices and the float workspace shared: graphs replay one at a time)
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_workspace: torch.Tensor | None = None
        self._graph_indices: torch.Tensor | None = None
        #: recorded after each plan: a plan's host-to-device copies read pinned host buffers
        #: that the next plan of the same wrapper rewrites
        self._planned: dict[int, torch.cuda.Event] = {}

    def _paged(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        ps, p = self.pool.page_size, self.pool
        shape = (p.num_slots // ps, ps, p.num_kv_heads, p.head_dim)
        return p.k[layer_id].view(shape), p.v[layer_id].view(shape)

    def prepare(self, batch: Batch, q_dtype: torch.dtype | None = None) -> None:
        """Plan the batch's wrapper; ``q_dtype`` defaults to the pool's compute dtype."""
        s, ps = self.shape, self.pool.page_size
        table = page_table(batch, ps)
        q_dtype = q_dtype or self.pool.compute_dtype
        if batch.is_decode:
            self._plan_decode(self._decode, table, q_dtype)
            batch.attn_metadata = self._decode
            return
        mask = tree_custom_mask(batch) if batch.tree_mask is not None else None
        qo, kv_indptr, last = table.qo_indptr, table.kv_indptr, table.kv_last_page_len
        wrapper = self._prefill
        if mask is not None:  # FlashInfer packs a custom mask on the device, by device offsets
            dev = self.pool.device
            qo, kv_indptr, last = qo.to(dev), kv_indptr.to(dev), last.to(dev)
            if self._tree is None:
                import flashinfer

                self._tree = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    self._prefill_workspace, "NHD", backend="fa2")
            wrapper = self._tree
        self._settled(wrapper)
        wrapper.plan(
            qo, kv_indptr, table.kv_indices, last,
            s.num_q_heads, s.num_kv_heads, s.head_dim, ps, causal=mask is None,
            custom_mask=mask, sm_scale=s.scaling, q_data_type=q_dtype,
            kv_data_type=self.pool.dtype)
        self._planned_now(wrapper)
        batch.attn_metadata = wrapper

    def _settled(self, wrapper: Any) -> None:
        """Wait until the host-to-device copies of ``wrapper``'s previous plan have run (they
        read its pinned buffers; with the overlap scheduler the host plans a step ahead)."""
        event = self._planned.get(id(wrapper))
        if event is not None:
            event.synchronize()

    def _planned_now(self, wrapper: Any) -> None:
        event = self._planned.setdefault(id(wrapper), torch.cuda.Event())
        event.record()

    def _plan_decode(self, wrapper: Any, table: PageTable, q_dtype: torch.dtype) -> None:
        s = self.shape
        self._settled(wrapper)
        wrapper.plan(table.kv_indptr, table.kv_indices, table.kv_last_page_len, s.num_q_heads,
                     s.num_kv_heads, s.head_dim, self.pool.page_size, sm_scale=s.scaling,
                     q_data_type=q_dtype, kv_data_type=self.pool.dtype)
        self._planned_now(wrapper)

    def prepare_graph(self, batch: Batch) -> None:
        """A decode wrapper for this batch size over fixed buffers, planned for the capture
        (the static batch: one token per request); each replay plans it again first."""
        import flashinfer

        size, dev = batch.batch_size, self.pool.device
        if self._graph_workspace is None:
            self._graph_workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        pages_per_request = -(-batch.req_to_token.shape[1] // self.pool.page_size)
        need = size * pages_per_request
        if self._graph_indices is None or self._graph_indices.numel() < need:
            if self._graph_wrappers:
                raise PluginError("flashinfer: capture the largest CUDA-graph batch first")
            self._graph_indices = torch.zeros(need, dtype=torch.int32, device=dev)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._graph_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(size + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=self._graph_indices,
            paged_kv_last_page_len_buffer=torch.zeros(size, dtype=torch.int32, device=dev))
        self._graph_wrappers[size] = wrapper
        self._plan_decode(wrapper, page_table(batch, self.pool.page_size),
                          self.pool.compute_dtype)
        batch.attn_metadata = wrapper

    def prepare_replay(self, batch: Batch, size: int) -> None:
        self._plan_decode(self._graph_wrappers[size],
                          padded_table(batch, self.pool.page_size, size), self.pool.compute_dtype)

    def _check(self, layer: AttentionLayerSpec) -> None:
        got = PlanShape(layer.num_q_heads, layer.num_kv_heads, layer.head_dim, layer.scaling)
        s = self.shape
        if (got.num_q_heads, got.num_kv_heads, got.head_dim) != (s.num_q_heads, s.num_kv_heads,
                                                                   s.head_dim) \
                or not math.isclose(got.scaling, s.scaling, rel_tol=1e-6):
            raise PluginError(f"flashinfer: layer {layer.layer_id} is {got}, the batch was "
                              f"planned for {self.shape}")

    def forward_extend(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        self._check(layer)
        wrapper = batch.attn_metadata if batch.attn_metadata is not None else self._prefill
        return wrapper.run(q.contiguous(), self._paged(layer.layer_id), **self._scales(layer))

    def forward_decode(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        """With the wrapper the batch was planned on: the eager one, or (captured and
        replayed) the graph wrapper of its size."""
        self._check(layer)
        wrapper = batch.attn_metadata if batch.attn_metadata is not None else self._decode
        return wrapper.run(q.contiguous(), self._paged(layer.layer_id), **self._scales(layer))

    def _scales(self, layer: AttentionLayerSpec) -> dict[str, float]:
        """An fp8 pool's layer scales as ``run`` takes them (a scale of 1 is left out: the
        value scale costs a multiply of the output)."""
        if not self.pool.is_fp8:
            return {}
        i = layer.layer_id
        scales = {"k_scale": self.pool.k_scale[i], "v_scale": self.pool.v_scale[i]}
        return {name: value for name, value in scales.items() if value != 1.0}


@hookimpl
def engine_create_attention_backend(pool: KVPool, model_config: Any, config: Any) -> Any:
    if pool.device.type != "cuda":
        raise PluginError(f"attention backend flashinfer needs a CUDA GPU; the KV pool is on "
                          f"{pool.device.type}")
    head_dim = model_config.head_dim
    shape = PlanShape(model_config.num_attention_heads, model_config.num_key_value_heads,
                      head_dim, head_dim ** -0.5)
    return FlashInferBackend(pool, shape)
