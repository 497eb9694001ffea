"""triton: paged attention with our own Triton kernels (see ``kernels.py`` for their design).

``prepare`` builds, once per forward, the small per-batch tables from the CPU copies of the
lengths (no device sync): for decode the number of KV splits, for extend the tile -> request
table and each request's first row in ``q``. Every layer then launches the kernels on the pool's
buffers directly; K/V are never gathered into a contiguous copy. The extend kernel is given the
pool's page size (its whole key tiles read slots per page, not per key) and, with
``KernelConfig.extend_tma`` where a page holds whole key tiles, tensor descriptors of K and V.

Options (the hook's ``options``): ``triton_attention_num_kv_splits`` (the most splits per
request, capped at one per key tile, and on a GPU at what keeps about four programs per
multiprocessor busy: at batch 128 x 8 KV heads there are programs enough without splitting,
and splits would only add partial outputs and a merge), ``triton_attention_split_tile_size``
(fixed tokens per split instead: the split layout depends only on a request's own length), and
``triton_attention_reduce_in_fp32`` (float32 partial outputs; they are float32 anyway when q is).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import torch

from engine.api import ConfigError, PluginError
from engine.api import hookimpl
from engine.api.attention import AttentionBackend, AttentionLayerSpec, KVPool
from engine.api.attention import Batch, GroupCodes, to_device

LOG2E = 1.4426950408889634


@dataclass
class KernelConfig:
    """Launch parameters; the benchmark may override them to sweep. The defaults were the best of
    ``benchmarks/attention_gpu.py``'s sweep on an H200 (bf16, 32 q / 8 kv heads, head dim 128)."""

    decode_block_n: int = 64
    decode_warps: int = 4
    decode_stages: int = 3
    #: the last split of each (request, KV head) folds the splits' partial outputs itself
    #: (an atomic counter per pair) instead of a separate merge kernel;
    #: ``ENGINE_TRITON_DECODE_FUSED_MERGE=1`` turns it on where the config is the default
    decode_fused_merge: bool = field(
        default_factory=lambda: os.environ.get("ENGINE_TRITON_DECODE_FUSED_MERGE") == "1")
    #: at batch 1 each decode program reads its first key tile (all but the newest token's
    #: row) before it waits for the previous kernel, not after (fp4 pools excepted; on an H200
    #: 3.89 against 3.90 ms a step at batch 1, and slower at batch 32, 5.33 against 5.24, so
    #: batch 1 only); ``ENGINE_TRITON_DECODE_PRELOAD=0`` turns it off where the config is the
    #: default
    decode_preload: bool = field(
        default_factory=lambda: os.environ.get("ENGINE_TRITON_DECODE_PRELOAD", "1") != "0")
    extend_block_m: int = 128
    extend_block_n: int = 32
    extend_warps: int = 4
    extend_stages: int = 3
    #: whole key tiles inside one page (page size a multiple of ``extend_block_n``) load K/V
    #: through tensor descriptors (TMA on Hopper) instead of pointers
    extend_tma: bool = False
    #: query heads in an extend tile's rows (0: the whole GQA group, each K/V tile read once
    #: for it; 1: one head's tokens, the plain flash-attention layout); divides the group
    extend_row_heads: int = 0
    #: rescale the running softmax state only when a row's maximum grows by more than
    #: ``kernels.LAZY_GROWTH`` (one decision per key tile), not at every key tile
    extend_lazy_rescale: bool = False
    #: read whole key tiles' slot-table entries outside the software pipeliner (an inline
    #: load; ``engine.runtime.triton_loads``), so K/V tiles load ``extend_stages - 1`` tiles
    #: ahead instead of one (a GPU only: the interpreter always uses ``tl.load``)
    extend_index_asm: bool = True
    #: an extend forward that gets this forward's new K/V (``AttentionBackend.forward``)
    #: reads them as contiguous rows through tensor descriptors, at any page size, and only
    #: the cached prefix through the pool (non-fp8 pools, no tree, one split, head dim a power
    #: of two; else the pool as usual); :func:`default_config` says where it is on
    extend_new_kv: bool = False
    #: where the new K/V come as rows, the query tile loads through a tensor descriptor of q
    #: [T, H, D] (one [tokens, heads, D] box, TMA on Hopper) instead of pointers (on the
    #: H200, 5-9 % less time for an 8 x 1024 prefill; attention-h200.md);
    #: ``ENGINE_TRITON_Q_DESC=0`` turns it off where the config is the default
    extend_q_desc: bool = field(
        default_factory=lambda: os.environ.get("ENGINE_TRITON_Q_DESC") != "0")


#: under the interpreter every program and every loop step costs milliseconds: big tiles
INTERPRETER_CONFIG = KernelConfig(decode_block_n=128, extend_block_m=128, extend_block_n=128)
#: pages that do not hold whole 64-key tiles: an extend's new K/V read as rows
#: (``extend_new_kv``), tiles of 16 tokens x the GQA group's heads against 32 keys through
#: tensor descriptors, the cached prefix through the pool by pointers (on the H200, 8 x 1024
#: causal prefill at page 16: 0.216 ms against 0.251 for the pool launch; at page 64 the same
#: launch is no faster than TMA_PAGE_LAUNCH, 0.214 against 0.216; attention-h200.md)
NEW_KV_LAUNCH = dict(extend_block_m=64, extend_block_n=32, extend_warps=4, extend_stages=3,
                     extend_tma=True, extend_row_heads=0, extend_new_kv=True)
#: a pool of pages of whole 64-key tiles: tiles of 64 tokens of one query head against 64
#: keys through tensor descriptors (on the H200, 8 x 1024 causal prefill at page 64: 0.225 ms
#: against 0.250 for the general launch; docs/benchmarks/attention-h200.md)
#: (fields of a KernelConfig, made per backend: the others' defaults read the environment)
TMA_PAGE_LAUNCH = dict(extend_block_m=64, extend_block_n=64, extend_warps=4, extend_stages=3,
                       extend_tma=True, extend_row_heads=1)


def default_config(page_size: int, interpreted: bool | None = None) -> KernelConfig:
    """The launch a backend over pages of ``page_size`` slots gets when none is given (the
    environment read per backend: ``ENGINE_TRITON_NEW_KV=0`` keeps the new K/V in the pool
    everywhere, ``=1`` reads them as rows at page sizes of whole 64-key tiles too;
    ``ENGINE_TRITON_DECODE_LAUNCH=BLOCK_N,warps,stages`` sets the decode kernel's, for
    sweeps)."""
    if interpreting() if interpreted is None else interpreted:
        return INTERPRETER_CONFIG
    rows = os.environ.get("ENGINE_TRITON_NEW_KV")
    if page_size % TMA_PAGE_LAUNCH["extend_block_n"] == 0:
        cfg = KernelConfig(**TMA_PAGE_LAUNCH, extend_new_kv=rows == "1")  # type: ignore
    elif rows != "0":
        cfg = KernelConfig(**NEW_KV_LAUNCH)  # type: ignore[arg-type]
    else:
        cfg = KernelConfig()
    decode = os.environ.get("ENGINE_TRITON_DECODE_LAUNCH")
    if decode:
        bn, warps, stages = (int(v) for v in decode.split(","))
        cfg = replace(cfg, decode_block_n=bn, decode_warps=warps, decode_stages=stages)
    return cfg


#: (request, KV head) pairs the fused merge's counters cover (more: the merge kernel)
MERGE_COUNTERS = 1 << 16


@dataclass
class DecodeMetadata:
    num_splits: int
    split_tile: int  #: fixed tokens per split, 0: ``num_splits`` equal chunks per request


@dataclass
class ExtendMetadata:
    tile_req: torch.Tensor  #: [tiles] int32, request of each tile of new tokens
    tile_start: torch.Tensor  #: [tiles] int32, first new-token index of the tile
    qo_start: torch.Tensor  #: [B] int64, first row of each request in q / the output
    tile_tokens: int
    tree: torch.Tensor | None = None  #: speculative tree verify: [B, Q, Q] uint8
    num_splits: int = 1  #: programs sharing each tile's prefix keys (then a merge)
    block_rows: int = 0  #: query rows per program (tile tokens x the group's heads, padded)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class TritonBackend(AttentionBackend):
    """Split-KV GQA decode + LSE merge; tiled causal extend over prefix pages then new tokens
    (or a speculative tree's mask over them)."""

    supports_tree_verify = True
    supports_verify_graph = True  # the extend kernel reads every length on the device
    supports_fp8_kv_cache = True  # the kernels widen fp8 K/V and apply the layer's scales

    def __init__(self, pool: KVPool, group: int, *, num_kv_splits: int = 8,
                 split_tile_size: int | None = None,
                 reduce_in_fp32: bool = False, kernel_config: KernelConfig | None = None) -> None:
        super().__init__(pool)
        from engine_attention_triton import kernels  # after the interpreter check

        from engine.api.triton import launch_options

        self.kernels = kernels
        #: every kernel launches with programmatic dependent launch where the device has it
        self._pdl = launch_options(pool.device)
        self.num_kv_splits, self.split_tile_size = num_kv_splits, split_tile_size
        self.reduce_in_fp32 = reduce_in_fp32
        self.group = group
        #: on a GPU, splits beyond ~4 programs per multiprocessor only add merge work
        self._programs = (4 * torch.cuda.get_device_properties(pool.device).multi_processor_count
                          if pool.device.type == "cuda" else None)
        #: Triton's fp8 types need SM89+ on a GPU
        self.supports_fp8_kv_cache = (pool.device.type != "cuda" or
                                      torch.cuda.get_device_capability(pool.device) >= (8, 9))
        #: fp4_mx_block16 rows are unpacked in the kernels, for a power-of-two head dimension
        self.supports_fp4_kv_cache = pool.head_dim == _pow2(pool.head_dim)
        #: the fused merge's counters, one per (request, KV head), zero between launches
        #: (made by the first configuration that folds the merge)
        self._counters: torch.Tensor | None = None
        #: tensor descriptors of the pool's K/V buffers (:meth:`_descriptors`), by buffer
        self._pool_descriptors: dict[tuple[Any, ...], tuple[Any, Any] | None] = {}
        self.configure(kernel_config or default_config(pool.page_size))

    def configure(self, cfg: KernelConfig) -> None:
        """Set the launch parameters (takes effect at the next ``prepare``)."""
        heads = cfg.extend_row_heads or self.group
        if self.group % heads:
            raise ValueError(f"extend_row_heads={heads} does not divide the group of "
                             f"{self.group} query heads per KV head")
        self.cfg = cfg
        if cfg.decode_fused_merge and self._counters is None:
            self._counters = torch.zeros(MERGE_COUNTERS, dtype=torch.int32,
                                         device=self.pool.device)
        #: query heads of an extend tile; its rows are tokens x these heads
        self.row_heads = heads
        self.block_rows = max(cfg.extend_block_m, _pow2(heads))
        self.tile_tokens = self.block_rows // heads

    def reads_new_kv(self, batch: Batch) -> bool:
        """Rows where configured, for a pool of unquantized values, an extend without a tree
        (a verify's tokens go through its mask) whose tiles are not split
        (:meth:`forward_extend`)."""
        md = batch.attn_metadata
        return (self.cfg.extend_new_kv and not self.pool.quantized
                and isinstance(md, ExtendMetadata) and md.tree is None and md.num_splits == 1)

    @property
    def supports_cuda_graph(self) -> bool:  # type: ignore[override]
        """Graph replay needs a split count fixed per batch size: equal-chunk splitting
        (the default) qualifies; a fixed ``--triton-attention-split-tile-size`` does not."""
        return not self.split_tile_size

    # ------------------------------------------------------------------ metadata

    def _max_splits(self, units: int, interpreted: int | None = None) -> int:
        """``num_kv_splits``, capped (on a GPU) where ``units`` programs per KV head (decode:
        the requests; extend: the tiles) alone keep about four programs per multiprocessor
        busy; without a GPU ``interpreted`` when given (fewer splits, faster to interpret)."""
        if self._programs is None:
            return max(1, min(self.num_kv_splits, interpreted or self.num_kv_splits))
        need = -(-self._programs // (units * self.pool.num_kv_heads))
        return max(1, min(self.num_kv_splits, need))

    def prepare_graph(self, batch: Batch) -> None:
        """Always the batch size's most splits, as equal chunks of each request's own length
        (the kernels skip empty chunks), so one capture serves every context length."""
        batch.attn_metadata = DecodeMetadata(self._max_splits(batch.batch_size), 0)

    def prepare_verify_graph(self, batch: Batch) -> None:
        """Every request has the same new tokens, so the tile table depends on the batch's
        shape only; the kernel reads the prefix lengths and the tree mask (the batch's own
        buffer, read in place) on the device."""
        self.prepare(batch)

    def prepare(self, batch: Batch) -> None:
        seq = batch.seq_lens_cpu or batch.seq_lens.tolist()
        if batch.is_decode:
            longest = max(seq)
            if self.split_tile_size:
                batch.attn_metadata = DecodeMetadata(-(-longest // self.split_tile_size),
                                                     self.split_tile_size)
            else:
                tiles = -(-longest // self.cfg.decode_block_n)
                batch.attn_metadata = DecodeMetadata(
                    max(1, min(self._max_splits(batch.batch_size), tiles)), 0)
            return
        ext = batch.extend_lens_cpu or batch.extend_lens.tolist()
        prefix = batch.prefix_lens_cpu or batch.prefix_lens.tolist()
        rows, heads = self.block_rows, self.row_heads
        if max(ext) * heads < rows:  # a few new tokens each (a verify): a smaller tile
            rows = max(16, _pow2(max(ext) * heads))
        bm = rows // heads
        tiles, qo_start, acc = [], [], 0
        for i, (p, e) in enumerate(zip(prefix, ext)):
            tiles += [(p + m0, i, m0) for m0 in range(0, e, bm)]
            qo_start.append(acc)
            acc += e
        tiles.sort(key=lambda tile: -tile[0])  # the most keys first
        tile_req = [i for _, i, _ in tiles]
        tile_start = [m0 for _, _, m0 in tiles]
        dev = batch.seq_lens.device
        # requests of one tile each (a verify, short chunks) split their prefix keys when the
        # tiles alone leave the machine idle
        splits = self._max_splits(len(tiles), interpreted=2) if max(ext) <= bm else 1
        batch.attn_metadata = ExtendMetadata(
            to_device(tile_req, dev, torch.int32), to_device(tile_start, dev, torch.int32),
            to_device(qo_start, dev), bm,
            _mask_bytes(batch.tree_mask) if batch.tree_mask is not None else None, splits,
            rows)

    # ------------------------------------------------------------------ kernels

    def _kv(self, layer: AttentionLayerSpec) -> tuple[torch.Tensor, torch.Tensor, int, float,
                                                       float]:
        """The layer's K/V buffers for the kernels, the fp8 kind (0: none, 1: e4m3, 2: e5m2;
        the buffers then as their bit patterns) and the layer's K and V scales."""
        pool, i = self.pool, layer.layer_id
        if not pool.is_fp8:
            return pool.k[i], pool.v[i], 0, 1.0, 1.0
        from engine.api.triton import fp8_kind

        return (pool.k[i].view(torch.uint8), pool.v[i].view(torch.uint8), fp8_kind(pool.dtype),
                float(pool.k_scale[i]), float(pool.v_scale[i]))

    def _check(self, q: torch.Tensor, layer: AttentionLayerSpec, batch: Batch) -> torch.Tensor:
        if batch.req_to_token.stride(1) != 1:
            raise ValueError("req_to_token must have unit stride along tokens")
        return q if q.stride(-1) == 1 else q.contiguous()

    def attend_codes(self, q: torch.Tensor, layer: AttentionLayerSpec, batch: Batch,
                     fmt: tuple[torch.dtype, int]) -> GroupCodes | None:
        """A decode whose splits the merge kernel folds writes its output as fp8 codes per
        head (``fmt``'s group a head's width), in that kernel (``ENGINE_TRITON_OUTPUT_CODES=0``:
        never, for A/B runs); else ``None``."""
        md = batch.attn_metadata
        if not (os.environ.get("ENGINE_TRITON_OUTPUT_CODES") != "0" and batch.is_decode
                and isinstance(md, DecodeMetadata) and md.num_splits > 1
                and fmt[1] == layer.head_dim and q.dtype in (torch.float16, torch.bfloat16)
                and not self._folds_merge(md.num_splits, q.shape[0], layer)):
            return None
        return self.forward_decode(q, layer, batch, codes=fmt[0])

    def _folds_merge(self, splits: int, bsz: int, layer: AttentionLayerSpec) -> bool:
        """Whether the split kernel folds the merge itself (no merge kernel runs)."""
        return (self.cfg.decode_fused_merge and splits > 1
                and bsz * layer.num_kv_heads <= MERGE_COUNTERS)

    def forward_decode(self, q: torch.Tensor, layer: AttentionLayerSpec,
                       batch: Batch, codes: torch.dtype | None = None) -> Any:
        """The decode's output, or with ``codes`` (an fp8 dtype; only where the merge kernel
        runs: :meth:`attend_codes`) its :class:`GroupCodes` per head."""
        md: DecodeMetadata = batch.attn_metadata
        q = self._check(q, layer, batch)
        k_buf, v_buf, fp8, k_scale, v_scale = self._kv(layer)
        bsz, hq, dim = q.shape
        hkv, group = layer.num_kv_heads, layer.num_q_heads // layer.num_kv_heads
        splits = md.num_splits
        part_dtype = torch.float32 if self.reduce_in_fp32 else q.dtype
        shape = (bsz, hq, splits) if splits > 1 else (0, 0, 1)  # one split: written directly
        part_out = torch.empty((*shape, dim), dtype=part_dtype, device=q.device)
        part_lse = torch.empty(shape, dtype=torch.float32, device=q.device)
        out = torch.empty_like(q)
        cfg, r2t = self.cfg, batch.req_to_token
        prec = "ieee" if q.dtype == torch.float32 else None
        fused = self._folds_merge(splits, bsz, layer)
        self.kernels._decode_split_kernel[(bsz, hkv, splits)](
            q, k_buf, v_buf, r2t, batch.req_pool_indices, batch.seq_lens, part_out, part_lse, out,
            self._counters if fused else out,  # (a placeholder when not folded)
            q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
            v_buf.stride(1), r2t.stride(0),
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
            layer.scaling * LOG2E * k_scale, md.split_tile, v_scale,
            GROUP=group, HEAD_DIM=dim, NUM_SPLITS=splits, BLOCK_H=max(16, _pow2(group)),
            BLOCK_D=_pow2(dim), BLOCK_N=cfg.decode_block_n, FIXED_TILE=md.split_tile > 0,
            DOT_PREC=prec, KV_FP8=fp8, KV_FP4=self.pool.is_fp4, FUSED_MERGE=fused,
            PRELOAD=cfg.decode_preload and bsz == 1 and not self.pool.is_fp4,
            num_warps=cfg.decode_warps,
            num_stages=cfg.decode_stages, **self._pdl)
        if splits > 1 and not fused:
            xq = xs = None
            fmt: dict[str, Any] = {}
            if codes is not None:  # (the rows [bsz, hq * dim] in groups of a head)
                from engine.api.triton import group_code_buffers

                xq, xs, fmt = group_code_buffers(bsz, hq * dim, codes, dim, q.device)
                fmt["CODES"] = True
            self.kernels._decode_merge_kernel[(bsz, hkv)](
                part_out, part_lse, out, batch.seq_lens, part_out.stride(0),
                part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
                out.stride(0), out.stride(1), md.split_tile,
                xq.view(torch.uint8) if xq is not None else out, xs if xs is not None else out,
                bsz, xq.stride(0) if xq is not None else 0, GROUP=group, HEAD_DIM=dim,
                NUM_SPLITS=splits, BLOCK_G=_pow2(group), BLOCK_D=_pow2(dim),
                BLOCK_N=cfg.decode_block_n, FIXED_TILE=md.split_tile > 0, num_warps=4,
                **fmt, **self._pdl)
            if xq is not None:
                return GroupCodes(xq, xs.t(), dim, q.dtype)
        elif codes is not None:
            raise ValueError("decode output codes need the merge kernel (attend_codes)")
        return out

    def forward_extend(self, q: torch.Tensor, layer: AttentionLayerSpec, batch: Batch,
                       new_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                       ) -> torch.Tensor:
        md: ExtendMetadata = batch.attn_metadata
        q = self._check(q, layer, batch)
        k_buf, v_buf, fp8, k_scale, v_scale = self._kv(layer)
        dim = q.shape[2]
        out = torch.empty_like(q)
        cfg, r2t = self.cfg, batch.req_to_token
        group = layer.num_q_heads // layer.num_kv_heads
        if group != self.group:
            raise ValueError(f"layer {layer.layer_id}: {group} query heads per KV head, the "
                             f"backend was built for {self.group}")
        tree = md.tree if md.tree is not None else md.tile_req  # a placeholder when unused
        page = self.pool.page_size
        tma = self._descriptors(k_buf, v_buf, page)  # or None: pointers (placeholders)
        tb, tq = (md.tree.stride(0), md.tree.stride(1)) if md.tree is not None else (0, 0)
        splits = md.num_splits
        rows = None  # this forward's K/V as descriptors of their rows
        if new_kv is not None and self.reads_new_kv(batch):
            rows = self._new_kv_descriptors(new_kv, q.dtype)
        box = (md.tile_tokens, self.row_heads, dim)  # a tile's [tokens, heads, D] of q
        q_desc = None  # the query tile as one box of q (with the rows; whole tiles of rows)
        if (rows is not None and cfg.extend_q_desc
                and md.tile_tokens * self.row_heads == md.block_rows):
            q_desc = _q_descriptor(q, box)
        part_dtype = torch.float32 if self.reduce_in_fp32 else q.dtype
        shape = (q.shape[0], q.shape[1], splits) if splits > 1 else (0, 0, 1)
        part_out = torch.empty((*shape, dim), dtype=part_dtype, device=q.device)
        part_lse = torch.empty(shape, dtype=torch.float32, device=q.device)
        self.kernels._extend_kernel[(layer.num_q_heads // self.row_heads, md.tile_req.shape[0],
                                     splits)](
            q, k_buf, v_buf, out, r2t, batch.req_pool_indices, batch.prefix_lens,
            batch.extend_lens, md.qo_start, md.tile_req, md.tile_start, tree, part_out,
            part_lse, *(tma or (k_buf, v_buf)), *(rows or (k_buf, v_buf)),
            q_desc if q_desc is not None else q, q.stride(0),
            q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
            out.stride(0), out.stride(1),
            r2t.stride(0), tb, tq, part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), layer.scaling * LOG2E * k_scale, v_scale,
            GROUP=group, HEAD_DIM=dim, TILE_TOKENS=md.tile_tokens, BLOCK_M=md.block_rows,
            BLOCK_N=cfg.extend_block_n, BLOCK_D=_pow2(dim),
            DOT_PREC="ieee" if q.dtype == torch.float32 else None, HAS_TREE=md.tree is not None,
            KV_FP8=fp8, KV_FP4=self.pool.is_fp4, NUM_SPLITS=splits, PAGE=page,
            TMA=tma is not None,
            ROW_HEADS=self.row_heads, LAZY=cfg.extend_lazy_rescale,
            INDEX_ASM=cfg.extend_index_asm and q.is_cuda and not interpreting(),
            # element offsets fit in 32 bits (fewer registers for gathered rows)
            OFF32=max(k_buf.numel(), v_buf.numel(), q.numel(), part_out.numel()) < 2 ** 31,
            NEW_KV=rows is not None, Q_DESC=q_desc is not None,
            num_warps=cfg.extend_warps, num_stages=cfg.extend_stages, **self._pdl)
        if splits > 1:
            self.kernels._extend_merge_kernel[(q.shape[0], layer.num_kv_heads)](
                part_out, part_lse, out, part_out.stride(0), part_out.stride(1),
                part_out.stride(2), part_lse.stride(0), part_lse.stride(1), out.stride(0),
                out.stride(1), GROUP=group, HEAD_DIM=dim, NUM_SPLITS=splits,
                BLOCK_G=_pow2(group), BLOCK_D=_pow2(dim), num_warps=4, **self._pdl)
        return out

    def _descriptors(self, k_buf: torch.Tensor, v_buf: torch.Tensor,
                     page: int) -> tuple[Any, Any] | None:
        """Tensor descriptors of the [slots, Hkv * D] views of K and V with [BLOCK_N, D]
        blocks for the extend kernel's whole tiles, or None: not asked for
        (``extend_tma``), or a tile not inside one page, or a layout TMA cannot take
        (:func:`_row_descriptors`)."""
        bn = self.cfg.extend_block_n
        if not self.cfg.extend_tma or page % bn or self.pool.is_fp4:  # (fp4: packed rows)
            return None
        # the pool's buffers never move: each layer's descriptors are made once
        key = (k_buf.data_ptr(), v_buf.data_ptr(), k_buf.shape, v_buf.shape, k_buf.dtype, bn)
        if key not in self._pool_descriptors:
            self._pool_descriptors[key] = _row_descriptors(k_buf, v_buf, bn)
        return self._pool_descriptors[key]

    def _new_kv_descriptors(self, new_kv: tuple[torch.Tensor, torch.Tensor],
                            dtype: torch.dtype) -> tuple[Any, Any] | None:
        """Tensor descriptors of this forward's K and V rows, or None where they cannot serve
        (a dtype other than q's, a layout TMA cannot take)."""
        if any(x.dtype != dtype for x in new_kv):
            return None
        return _row_descriptors(*new_kv, self.cfg.extend_block_n)


def _q_descriptor(q: torch.Tensor, box: tuple[int, int, int]) -> Any:
    """A tensor descriptor of q (or out) [T, H, D] with [tokens, heads, D] boxes, or None where
    TMA cannot take it (a head dimension not a power of two, rows or heads not 16-byte
    aligned)."""
    if not _tma_rows(q) or q.stride(1) * q.element_size() % 16:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(q, list(box))


def _tma_rows(x: torch.Tensor) -> bool:
    """``x`` [T, H, D] has what TMA needs of its rows: a head dimension that is a power of two
    and contiguous, a 16-byte aligned start and row stride."""
    d = x.shape[2]
    return (d == _pow2(d) and x.stride(2) == 1 and not x.data_ptr() % 16
            and not x.stride(0) * x.element_size() % 16)


def _row_descriptors(k: torch.Tensor, v: torch.Tensor, bn: int) -> tuple[Any, Any] | None:
    """Tensor descriptors of ``k`` and ``v`` [T, H, D] as their [T, H * D] rows (any row
    stride) with [bn, D] blocks, or None where TMA cannot take them (a head dimension not a
    power of two, heads not packed in a row, rows not 16-byte aligned)."""
    if any(not _tma_rows(x) or x.stride(1) != x.shape[2] for x in (k, v)):
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(x: torch.Tensor) -> Any:
        t, h, d = x.shape
        return TensorDescriptor.from_tensor(x.as_strided((t, h * d), (x.stride(0), 1)),
                                            [bn, d])

    return desc(k), desc(v)


def _mask_bytes(mask: torch.Tensor) -> torch.Tensor:
    """The tree mask as uint8 for the kernel: a view of a contiguous bool mask (so a captured
    forward reads the buffer its replays refresh), else a copy."""
    if mask.dtype == torch.bool and mask.is_contiguous():
        return mask.view(torch.uint8)
    return mask.to(torch.uint8).contiguous()


def backend_kwargs(opts: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`TritonBackend` keyword arguments from this plugin's options, validated."""
    splits = opts.get("triton_attention_num_kv_splits")
    splits = 8 if splits is None else int(splits)
    tile = opts.get("triton_attention_split_tile_size")
    if splits < 1:
        raise ConfigError(f"--triton-attention-num-kv-splits must be >= 1 (got {splits})")
    if tile is not None and int(tile) < 1:
        raise ConfigError(f"--triton-attention-split-tile-size must be >= 1 (got {tile})")
    return {"num_kv_splits": splits, "split_tile_size": int(tile) if tile else None,
            "reduce_in_fp32": bool(opts.get("triton_attention_reduce_in_fp32"))}


@hookimpl
def engine_create_attention_backend(pool: KVPool, model_config: Any, options: Any) -> Any:
    if pool.device.type != "cuda" and not interpreting():
        raise PluginError("attention backend triton needs a CUDA GPU (or TRITON_INTERPRET=1 "
                          f"on CPU); the KV pool is on {pool.device.type}")
    group = model_config.num_attention_heads // model_config.num_key_value_heads
    return TritonBackend(pool, group, **backend_kwargs(options))
