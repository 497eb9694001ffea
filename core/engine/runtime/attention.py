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
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from engine.runtime import kv_fp4
from engine.runtime.batch import Batch

if TYPE_CHECKING:
    from engine.runtime.linear import GroupCodes


@dataclass
class AttentionLayerSpec:
    """What a backend needs to know about one attention layer."""

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


def _cpu_zeros(count: int, shape: tuple[int, ...], dtype: torch.dtype
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``count`` zero tensors of ``shape`` (split in two halves) in one anonymous memory map:
    the kernel hands out zeroed pages on first touch, so creating the pool costs no time and
    the process's resident memory grows only with the slots actually written."""
    import math
    import mmap

    elem = torch.empty((), dtype=dtype).element_size()
    each = math.prod(shape) * elem
    buf = mmap.mmap(-1, max(count * each, 1))
    flat = torch.frombuffer(buf, dtype=torch.uint8)  # holds a reference to buf
    tensors = [flat[i * each:(i + 1) * each].view(dtype).view(shape) for i in range(count)]
    return tensors[:count // 2], tensors[count // 2:]


class KVPool:
    """K and V buffers of every layer, indexed by token slot: ``k[layer]`` is [slots, Hkv, D]
    (``fp4``: [slots, Hkv, :attr:`row_width`] bytes, :mod:`engine.runtime.kv_fp4`).

    Slot 0 is reserved as a padding target (never handed out), so a padded batch can write there
    harmlessly. Pages are ``page_size`` consecutive slots; the allocator (in the scheduler) hands
    out whole pages.
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int,
                 page_size: int, dtype: torch.dtype, device: torch.device,
                 fp4: bool = False, compute_dtype: torch.dtype | None = None) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        #: ``--kv-cache-dtype fp4_mx_block16``: each head's row is packed E2M1 codes and their
        #: blocks' scales, bytes (``dtype`` is then uint8, the storage's)
        self.is_fp4 = fp4
        if fp4:
            if head_dim % kv_fp4.BLOCK:
                raise ValueError(f"fp4_mx_block16 needs a head dimension that is a multiple "
                                 f"of {kv_fp4.BLOCK}, not {head_dim}")
            dtype = torch.uint8
        #: elements of ``dtype`` a head's row takes in ``k[layer]`` / ``v[layer]``
        self.row_width = self.row_width_of(head_dim, fp4)
        #: what the stored pages are, for the hierarchical cache's page keys
        self.format_name = "fp4_mx_block16" if fp4 else str(dtype)
        self.page_size, self.dtype, self.device = page_size, dtype, device
        #: what K/V come in as and are read back as (the model's activations): ``dtype``
        #: unless the pool stores another form (fp8, fp4 rows)
        self.compute_dtype = compute_dtype or dtype
        self.num_slots = num_slots
        shape = (num_slots, num_kv_heads, self.row_width)
        if torch.device(device).type == "cpu":
            self.k, self.v = _cpu_zeros(2 * num_layers, shape, dtype)
        else:
            # one allocation: each side's layers at a constant distance (the host tier's
            # runs of pages copy across layers in one 2-D copy)
            both = torch.zeros((2 * num_layers, *shape), dtype=dtype, device=device)
            self.k, self.v = list(both[:num_layers].unbind(0)), list(both[num_layers:].unbind(0))
        #: fp8 storage (``--kv-cache-dtype fp8_e4m3/fp8_e5m2``): values are stored divided by
        #: the layer's per-tensor scale and multiplied back on read (:meth:`gather`)
        self.is_fp8 = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        self.k_scale = [1.0] * num_layers
        self.v_scale = [1.0] * num_layers
        #: copies into the pool still in flight, per layer (the hierarchical cache's loads from
        #: the host tier: :class:`engine.runtime.host_pool.LayerLoads`), or None. Device work
        #: that reads or writes the pool is ordered after them: a decoder's layer loop takes
        #: them (:meth:`take_loads`) and waits for each layer's before running that layer, so a
        #: load overlaps the layers before it; anything else calls :meth:`settle_loads` first.
        self.loads: Any = None

    @staticmethod
    def row_width_of(head_dim: int, fp4: bool) -> int:
        """Elements a head's row of ``head_dim`` values takes in the pool (``fp4``: bytes)."""
        return kv_fp4.row_bytes(head_dim) if fp4 else head_dim

    @property
    def quantized(self) -> bool:
        """Whether values are stored in another form than they come in (fp8 with the layer's
        scales, fp4 rows): only :meth:`write` stores them and :meth:`gather` reads them."""
        return self.is_fp8 or self.is_fp4

    def take_loads(self) -> Any:
        """The pending loads (see :attr:`loads`), now the caller's to wait for; None if none."""
        loads, self.loads = self.loads, None
        return loads

    def settle_loads(self) -> None:
        """Order the device work queued from now on after every pending load."""
        if self.loads is not None:
            self.take_loads().wait_all()

    def _store(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        if self.is_fp4:
            return kv_fp4.pack(x)
        if not self.is_fp8:
            return x.to(self.dtype)
        top = torch.finfo(self.dtype).max
        return (x.to(torch.float32) / scale).clamp(-top, top).to(self.dtype)

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for buf, x, scale in ((self.k[layer], k, self.k_scale[layer]),
                              (self.v[layer], v, self.v_scale[layer])):
            x = self._store(x, scale)
            if self.is_fp8:  # fp8 index kernels are missing on some devices: move bytes
                buf, x = buf.view(torch.uint8), x.view(torch.uint8)
            buf.index_copy_(0, loc, x)

    def takes_direct_writes(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether a kernel may store K/V of ``dtype`` on ``device`` straight into ``k[layer]``
        / ``v[layer]`` rows instead of :meth:`write`: same compute dtype and device, and values
        stored as they come or, in an fp8 pool, as :meth:`write` stores them (divided by the
        layer's ``k_scale``/``v_scale``, saturated, rounded to the pool's fp8 type; fp4 rows
        only through :meth:`write`)."""
        return not self.is_fp4 and self.compute_dtype == dtype and \
            torch.device(self.device) == torch.device(device)

    def gather(self, layer: int, slots: torch.Tensor, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``slots`` [..] as ``dtype`` [.., Hkv, D], dequantized from fp8 or fp4
        storage."""
        flat = slots.reshape(-1)
        if self.is_fp4:
            k = kv_fp4.unpack(self.k[layer].index_select(0, flat), self.head_dim, dtype)
            v = kv_fp4.unpack(self.v[layer].index_select(0, flat), self.head_dim, dtype)
        elif self.is_fp8:
            k = self.k[layer].view(torch.uint8).index_select(0, flat).view(self.dtype)
            v = self.v[layer].view(torch.uint8).index_select(0, flat).view(self.dtype)
            k, v = k.to(dtype) * self.k_scale[layer], v.to(dtype) * self.v_scale[layer]
        else:
            k = self.k[layer].index_select(0, flat).to(dtype)
            v = self.v[layer].index_select(0, flat).to(dtype)
        shape = (*slots.shape, self.num_kv_heads, self.head_dim)
        return k.view(shape), v.view(shape)

    @property
    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.row_width * elem


class AttentionBackend(ABC):
    """One attention implementation. Subclasses state their own constraints in their manifest."""

    #: True when decode forwards can be captured in a CUDA graph (see :meth:`prepare_graph`)
    supports_cuda_graph: bool = False
    #: True when each token's output depends only on its query and its request's K/V, never on
    #: the other requests of the batch or on how its prompt was split into forwards
    #: (``--enable-deterministic-inference`` refuses a backend without it);
    #: :func:`attend_per_token` is such a path, for any backend that keeps the pool's layout
    batch_invariant: bool = False
    #: True when the backend reads an fp8 pool (through :meth:`KVPool.gather`, or in its own
    #: kernels with the pool's per-layer ``k_scale``/``v_scale``); ``--kv-cache-dtype fp8_*``
    #: refuses a backend without it
    supports_fp8_kv_cache: bool = False
    #: True when the backend reads an ``fp4_mx_block16`` pool (packed rows, through
    #: :meth:`KVPool.gather`); ``--kv-cache-dtype fp4_mx_block16`` refuses a backend without it
    supports_fp4_kv_cache: bool = False
    #: True when extend forwards honour ``batch.tree_mask`` (speculative tree verify); a
    #: backend without it can verify chains only (plain causal extend)
    supports_tree_verify: bool = False
    #: True when speculative verify forwards of a fixed shape can be captured in a CUDA graph
    #: (see :meth:`prepare_verify_graph`); needs ``supports_tree_verify``
    supports_verify_graph: bool = False
    #: True when an extend batch costs every request the longest request's length (padded
    #: rows): the scheduler then never mixes a large prefill with one-token decode rows
    pads_extend: bool = False

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def prepare(self, batch: Batch) -> None:
        """Build per-batch metadata into ``batch.attn_metadata`` (once per forward)."""

    def reads_new_kv(self, batch: Batch) -> bool:
        """True when ``forward_extend`` reads this (prepared) extend batch's new keys and
        values from ``new_kv=(k, v)`` [T, Hkv, D] (also in the pool) instead of through the
        pool's slots: :meth:`forward` then passes them, and a model that would store K/V
        itself leaves the store to :meth:`forward`. Default: never."""
        return False

    def decodes_from_pool(self, batch: Batch) -> bool:
        """True when this decode batch's attention is exactly :func:`decode_from_pool` (the
        core's CPU kernel), so a model may run it inside a whole-forward CPU plan
        (:class:`engine.runtime.fused_cpu.DecodePlan`) instead of calling :meth:`forward`.
        Default: False."""
        return False

    def prepare_graph(self, batch: Batch) -> None:
        """Metadata for a decode batch that is captured once and replayed for every later
        decode batch of the same size: it may depend only on the batch size and on device
        tensors the runner refreshes in place (``seq_lens``, ``req_pool_indices``,
        ``req_to_token``...), never on Python values of one step."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_verify_graph(self, batch: Batch) -> None:
        """Metadata for a VERIFY batch that is captured once and replayed for every later
        verify batch of its size: every request has the same number of new tokens
        (``extend_lens_cpu``), ``tree_mask`` is always given, and the replays refresh in place
        ``prefix_lens``, ``seq_lens``, ``req_pool_indices``, ``tree_mask`` and
        ``req_to_token``. The metadata may depend only on the shapes and on those tensors (read
        on the device), and no host work runs before a replay."""
        raise NotImplementedError(f"{type(self).__name__} does not capture verify forwards")

    def prepare_replay(self, batch: Batch, size: int) -> None:
        """Host work before the graph captured for ``size`` requests replays ``batch`` (at
        most ``size`` requests; the rest are padding: row 0, one token, K/V into the reserved
        slot 0). For a backend whose kernels read a plan the host writes into fixed device
        buffers (FlashInfer's ``plan``, run outside the graph); the default does nothing."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: AttentionLayerSpec, batch: Batch) -> torch.Tensor:
        self.pool.write(layer.layer_id, batch.out_cache_loc, k, v)
        if not batch.is_decode and self.reads_new_kv(batch):
            return self.forward_extend(q, layer, batch, new_kv=(k, v))  # type: ignore[call-arg]
        return self.attend(q, layer, batch)

    def attend(self, q: torch.Tensor, layer: AttentionLayerSpec, batch: Batch) -> torch.Tensor:
        """Attention of ``q`` once this forward's K/V are in the pool at
        ``batch.out_cache_loc``: written by :meth:`forward`, or by a model kernel that stores
        them itself where :meth:`KVPool.takes_direct_writes` allows it."""
        if batch.is_decode:
            return self.forward_decode(q, layer, batch)
        return self.forward_extend(q, layer, batch)

    def attend_codes(self, q: torch.Tensor, layer: AttentionLayerSpec, batch: Batch,
                     fmt: tuple[torch.dtype, int]) -> "GroupCodes | None":
        """:meth:`attend`, its output [T, Hq * D] written as the next layer's input codes
        ``fmt`` (fp8 dtype, group of columns: :meth:`engine.runtime.linear.Linear.group_codes`)
        by this backend's own kernel, bit for bit what ``quant_triton.quant_groups`` makes of
        :meth:`attend`'s output; or ``None`` (the default) where it does not write them, having
        done nothing: the caller then calls :meth:`attend`."""
        return None

    @abstractmethod
    def forward_extend(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        """New tokens attend to their cached prefix and, causally, to themselves."""

    @abstractmethod
    def forward_decode(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch) -> torch.Tensor:
        """One token per request attends to all of its cached tokens (itself included)."""


def attend_per_token(pool: KVPool, q: torch.Tensor, layer: AttentionLayerSpec,
                     batch: Batch) -> torch.Tensor:
    """Batch-invariant attention (extend and decode alike): each new token is one call of
    ``scaled_dot_product_attention`` of its own query (a fresh copy) against exactly the keys it
    sees (its request's first ``position + 1`` slots, gathered once per request into a fresh
    buffer), with the query heads of one KV head grouped. The shapes, strides and alignment of
    every call depend on the token alone, so its output does not depend on the batch, on the
    padding others would need, or on whether it is decoded or prefilled. One call per token:
    slow, meant for ``--enable-deterministic-inference``."""
    seq = batch.seq_lens_cpu or batch.seq_lens.tolist()
    ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
    rows = batch.req_to_token.index_select(0, batch.req_pool_indices)
    hkv, d = layer.num_kv_heads, layer.head_dim
    ratio = layer.num_q_heads // hkv
    out = torch.empty_like(q)
    t = 0
    for i, (n, e) in enumerate(zip(seq, ext)):
        slots = rows[i, :n]
        k, v = pool.gather(layer.layer_id, slots, q.dtype)
        k, v = k.transpose(0, 1), v.transpose(0, 1)
        for j in range(e):
            seen = n - e + j + 1
            query = q[t].clone().view(1, hkv, ratio, d)
            o = F.scaled_dot_product_attention(query, k[None, :, :seen], v[None, :, :seen],
                                               scale=layer.scaling)
            out[t] = o.reshape(layer.num_q_heads, d)
            t += 1
    return out


def pool_attention_applies(pool: KVPool) -> bool:
    """Whether :func:`attend_from_pool` serves this pool: float32, float16, bfloat16, fp8
    (with its layer scales) or fp4_mx_block16 rows on the CPU, kernels built."""
    if pool.device.type != "cpu":
        return False
    from engine.runtime import fused_cpu

    return (pool.is_fp4 or pool.dtype in fused_cpu.READ_TYPES) and fused_cpu.available()


def attend_from_pool(pool: KVPool, q: torch.Tensor, layer: AttentionLayerSpec,
                     req_to_token: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor,
                     max_len: int) -> torch.Tensor:
    """Attention read straight from a CPU pool (float32, or 16-bit values widened as they are
    read) by the core's C kernel
    (:func:`engine.runtime.fused_cpu.decode_attention`): query token ``t`` of ``q`` [T, Hq, D]
    attends to the first ``lens[t]`` slots of ``req_to_token[rows[t]]`` (no gather, no
    padding). Each (token, query head) pair is computed alone, in one fixed order, so a token's
    output depends on nothing but its query and its keys: the same whether it is decoded or
    prefilled, alone or in any batch. Decode: one token per request, ``lens`` = the sequence
    lengths; extend: ``lens[t]`` = position + 1 (causal). See :func:`pool_attention_applies`."""
    from engine.runtime import fused_cpu

    i = layer.layer_id
    if pool.is_fp4:
        return fused_cpu.decode_attention_fp4(q, pool.k[i], pool.v[i], req_to_token, rows, lens,
                                              max_len, layer.scaling, pool.head_dim)
    return fused_cpu.decode_attention(q, pool.k[i], pool.v[i], req_to_token, rows, lens,
                                      max_len, layer.scaling, pool.k_scale[i], pool.v_scale[i])


def decode_from_pool(pool: KVPool, q: torch.Tensor, layer: AttentionLayerSpec,
                     batch: Batch) -> torch.Tensor:
    """Decode attention through :func:`attend_from_pool` (one query per request: q [B, Hq, D]
    -> [B, Hq, D], in q's dtype), for a pool :func:`pool_attention_applies` to."""
    max_len = max(batch.seq_lens_cpu) if batch.seq_lens_cpu else int(batch.seq_lens.max())
    return attend_from_pool(pool, q.float(), layer, batch.req_to_token, batch.req_pool_indices,
                            batch.seq_lens, max_len).to(q.dtype)
