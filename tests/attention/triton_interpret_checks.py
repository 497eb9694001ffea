"""Checks of the triton attention plugin under Triton's interpreter, run as a child process.

``python triton_interpret_checks.py kit PAGE_SIZES GQA_RATIOS HEAD_DIMS [BLOCK_M,BLOCK_N,TMA]``
runs the conformance kit restricted to those comma-separated values (with those extend launch
parameters); ``python triton_interpret_checks.py own`` runs the checks the kit does not make
(several decode splits and their merge, empty splits, fixed split tiles and batch invariance,
float32 partials, extend over many prefix and query tiles, whole key tiles read through the
pages at page sizes above, below and not dividing the key tile, fp8 through descriptors).
Prints one JSON list of failures. ``TRITON_INTERPRET=1`` is set here, before triton is imported,
because the interpreter is chosen when the kernels are defined.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from engine.runtime.attention import AttentionLayerSpec, KVPool  # noqa: E402
from engine.runtime.batch import Batch, ForwardMode  # noqa: E402
from engine.testing import attention as kit  # noqa: E402
from engine.testing.batches import BatchBuilder  # noqa: E402
from engine_attention_triton.impl import (KernelConfig, TritonBackend,  # noqa: E402
                                         default_config)


def run_kit(pages: str, ratios: str, dims: str, tiles: str = "") -> list[str]:
    """The kit on those cases; ``tiles`` ``"BLOCK_M,BLOCK_N,TMA"``: the backend built with those
    extend launch parameters instead of the plugin's (e.g. key tiles inside one page)."""
    kit.PAGE_SIZES = tuple(int(x) for x in pages.split(","))
    kit.GQA_RATIOS = tuple(int(x) for x in ratios.split(","))
    kit.HEAD_DIMS = tuple(int(x) for x in dims.split(","))
    if tiles:
        bm, bn, tma = (int(x) for x in tiles.split(","))
        cfg = KernelConfig(extend_block_m=bm, extend_block_n=bn, extend_tma=bool(tma))

        def tiled(pool, model_config, config):  # noqa: ARG001 - the hook's keywords
            group = model_config.num_attention_heads // model_config.num_key_value_heads
            return TritonBackend(pool, group, kernel_config=cfg)
    return kit.check("triton", tiled if tiles else kit.plugin_backend("triton"),
                     device="cpu")


class Rig:
    """A one-layer pool, a batch builder, and a reference over what was written."""

    def __init__(self, page: int, ratio: int, dim: int, seed: int,
                 dtype: torch.dtype = torch.float32) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        hkv = 2
        self.spec = AttentionLayerSpec(0, hkv * ratio, hkv, dim, dim ** -0.5)
        slots = max(64 * page, 256)
        self.pool = KVPool(num_layers=1, num_kv_heads=hkv, head_dim=dim, num_slots=slots,
                           page_size=page, dtype=dtype, device=torch.device("cpu"))
        for buf in self.pool.k + self.pool.v:
            if self.pool.is_fp8:  # 448 in e4m3, NaN in e5m2: a read of slot 0 would show
                buf.view(torch.uint8).fill_(0x7E)
            else:
                buf.fill_(float("nan"))
                buf[:page] = 1e4
        self.builder = BatchBuilder(torch.zeros((8, 512), dtype=torch.int64), slots, page,
                                    shuffle=True, seed=seed)
        self.kv: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def stored(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """What the pool gives back for ``x``: itself, or its fp8 rounding times the scale."""
        if not self.pool.is_fp8:
            return x
        top = torch.finfo(self.pool.dtype).max
        return (x / scale).clamp(-top, top).to(self.pool.dtype).float() * scale

    def step(self, backend: TritonBackend, batch, rows: list[int], q=None, kv=None):
        """Run one forward; return (output, reference, q, (k, v))."""
        s, t = self.spec, batch.num_tokens
        q = self.rand(t, s.num_q_heads, s.head_dim) if q is None else q
        k, v = kv or (self.rand(t, s.num_kv_heads, s.head_dim),
                      self.rand(t, s.num_kv_heads, s.head_dim))
        backend.prepare(batch)
        out = backend.forward(q, k, v, s, batch)
        want, start = [], 0
        for i, row in enumerate(rows):
            n = batch.extend_lens_cpu[i]
            ks, vs = self.kv.setdefault(row, ([], []))
            ks.append(self.stored(k[start:start + n], self.pool.k_scale[0]))
            vs.append(self.stored(v[start:start + n], self.pool.v_scale[0]))
            want.append(kit.reference(q[start:start + n], torch.cat(ks), torch.cat(vs),
                                      batch.prefix_lens_cpu[i], s.scaling))
            start += n
        return out, torch.cat(want), q, (k, v)


def close(name: str, got: torch.Tensor, want: torch.Tensor) -> list[str]:
    if torch.isfinite(got).all() and torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        return []
    return [f"{name}: max error {(got - want).abs().max().item():.3g}"]


def own_checks() -> list[str]:
    failures: list[str] = []
    # decode over several splits, some of them empty (short requests), GQA 4, merged by LSE
    rig = Rig(page=16, ratio=4, dim=64, seed=1)
    for fp32 in (False, True):
        cfg = KernelConfig(decode_block_n=16)
        backend = TritonBackend(rig.pool, 4, num_kv_splits=4, reduce_in_fp32=fp32,
                                kernel_config=cfg)
        if not fp32:
            lengths = [1, 15, 16, 17, 70]
            rows = [rig.builder.new_request() for _ in lengths]
            batch = rig.builder.extend([(r, [1] * n) for r, n in zip(rows, lengths)])
            out, want, _, _ = rig.step(backend, batch, rows)
            failures += close("extend before split decode", out, want)
        batch = rig.builder.decode([(r, 2) for r in rows])
        backend.prepare(batch)
        if batch.attn_metadata.num_splits != 4:
            failures.append(f"expected 4 decode splits, got {batch.attn_metadata.num_splits}")
        out, want, _, _ = rig.step(backend, batch, rows)
        failures += close(f"split decode (fp32 partials={fp32})", out, want)

    # one request (its decode program reads its first key tile before the wait, the newest
    # token's row after it): the new token first, inside and last in a tile, over steps
    for fmt in (torch.float32, torch.float8_e4m3fn):
        rig = Rig(page=16, ratio=4, dim=64, seed=5, dtype=fmt)
        if rig.pool.is_fp8:
            rig.pool.k_scale[0], rig.pool.v_scale[0] = 0.05, 0.5
        backend = TritonBackend(rig.pool, 4, num_kv_splits=3,
                                kernel_config=KernelConfig(decode_block_n=16))
        for length in (15, 16, 23, 40):
            rig.kv.clear()
            row = rig.builder.new_request()
            out, want, _, _ = rig.step(backend, rig.builder.extend([(row, [1] * length)]),
                                       [row])
            for step in range(2):
                batch = rig.builder.decode([(row, 2)])
                out, want, _, _ = rig.step(backend, batch, [row])
                failures += close(f"one-request decode ({fmt}, {length} + {step + 1} keys)",
                                  out, want)

    # the merge folded into the split kernel (the last split of each request and KV head
    # folds them): the separate merge's outputs bit for bit, request after request
    rig = Rig(page=16, ratio=4, dim=64, seed=11)
    rows = [rig.builder.new_request() for _ in range(5)]
    batch = rig.builder.extend([(r, [1] * n) for r, n in zip(rows, [1, 15, 16, 17, 70])])
    plain = TritonBackend(rig.pool, 4, num_kv_splits=4,
                          kernel_config=KernelConfig(decode_block_n=16))
    rig.step(plain, batch, rows)
    fused = TritonBackend(rig.pool, 4, num_kv_splits=4, kernel_config=KernelConfig(
        decode_block_n=16, decode_fused_merge=True))
    for step in range(2):
        batch = rig.builder.decode([(r, 2) for r in rows])
        out, want, q, (k, v) = rig.step(fused, batch, rows)
        failures += close(f"split decode, merge in the split kernel (step {step})", out, want)
        plain.prepare(batch)
        again = plain.forward_decode(q, rig.spec, batch)
        if not torch.equal(out, again):
            failures.append("the folded merge differs from the merge kernel "
                            f"({(out - again).abs().max().item():.3g})")
        if int(fused._counters.abs().sum()):
            failures.append("the folded merge left its counters set")

    # fixed split tiles: a request's output does not depend on the rest of the batch
    rig = Rig(page=1, ratio=3, dim=64, seed=2)
    backend = TritonBackend(rig.pool, 3, split_tile_size=8,
                            kernel_config=KernelConfig(decode_block_n=16))
    rows = [rig.builder.new_request() for _ in range(3)]
    batch = rig.builder.extend([(r, [1] * n) for r, n in zip(rows, (30, 5, 50))])
    rig.step(backend, batch, rows)
    together = rig.builder.decode([(r, 2) for r in rows])
    out_all, want, q, (k, v) = rig.step(backend, together, rows)
    failures += close("fixed-tile decode", out_all, want)
    if together.attn_metadata.num_splits != 7:  # ceil(51 / 8)
        failures.append(f"fixed tile 8 over 51 tokens: {together.attn_metadata.num_splits} "
                        "splits, expected 7")
    one = torch.tensor([rows[0]])
    alone = Batch(mode=ForwardMode.DECODE, input_ids=together.input_ids[:1],
                  positions=together.positions[:1], out_cache_loc=together.out_cache_loc[:1],
                  req_pool_indices=one, seq_lens=together.seq_lens[:1],
                  prefix_lens=together.prefix_lens[:1], extend_lens=together.extend_lens[:1],
                  req_to_token=together.req_to_token, seq_lens_cpu=together.seq_lens_cpu[:1],
                  prefix_lens_cpu=together.prefix_lens_cpu[:1],
                  extend_lens_cpu=together.extend_lens_cpu[:1])  # the same request, alone
    backend.prepare(alone)
    out_alone = backend.forward(q[:1], k[:1], v[:1], rig.spec, alone)
    if not torch.equal(out_alone, out_all[:1]):
        failures.append("fixed-tile decode: output of a request changed with its batch "
                        f"({(out_alone - out_all[:1]).abs().max().item():.3g}, {alone.attn_metadata.num_splits} splits)")

    # extend: many query tiles and prefix tiles, prefix not tile-aligned, GQA 3
    rig = Rig(page=16, ratio=3, dim=64, seed=3)
    backend = TritonBackend(rig.pool, 3, kernel_config=KernelConfig(
        extend_block_m=16, extend_block_n=16))
    rows = [rig.builder.new_request() for _ in range(2)]
    batch = rig.builder.extend([(rows[0], [1] * 41), (rows[1], [1] * 3)])
    out, want, _, _ = rig.step(backend, batch, rows)
    failures += close("tiled extend (no prefix)", out, want)
    batch = rig.builder.extend([(rows[0], [1] * 23), (rows[1], [1] * 1)])
    out, want, _, _ = rig.step(backend, batch, rows)
    failures += close("tiled extend over a 41-token prefix", out, want)

    # extend tiles of fewer query heads than the group (1: one head's tokens; 2: half the
    # group), GQA 4: ragged, over a prefix not tile-aligned, then one token each (split prefix)
    # (2: with the lazy rescaling too, over scores that grow along the keys)
    for heads in (1, 2):
        rig = Rig(page=16, ratio=4, dim=64, seed=5 + heads)
        backend = TritonBackend(rig.pool, 4, kernel_config=KernelConfig(
            extend_block_m=16, extend_block_n=16, extend_row_heads=heads,
            extend_lazy_rescale=heads == 2))
        rows = [rig.builder.new_request() for _ in range(2)]
        for lengths in ((37, 5), (19, 1), (1, 1)):
            batch = rig.builder.extend([(r, [1] * n) for r, n in zip(rows, lengths)])
            out, want, _, _ = rig.step(backend, batch, rows)
            failures += close(f"extend, {heads} query heads a tile, new tokens {lengths}",
                              out, want)
    # lazy rescaling where the maxima grow by more than its threshold along the keys (keys
    # scaled up with their position) and where they do not: the same outputs
    rig = Rig(page=16, ratio=2, dim=64, seed=9)
    backend = TritonBackend(rig.pool, 2, kernel_config=KernelConfig(
        extend_block_m=16, extend_block_n=16, extend_lazy_rescale=True))
    rows = [rig.builder.new_request() for _ in range(2)]
    for lengths, growth in (((45, 7), 0.5), ((21, 3), 0.0)):
        batch = rig.builder.extend([(r, [1] * n) for r, n in zip(rows, lengths)])
        t = batch.num_tokens
        pos = torch.cat([torch.arange(n, dtype=torch.float32) for n in lengths])
        k = rig.rand(t, 2, 64) * (1 + growth * pos)[:, None, None]
        out, want, _, _ = rig.step(backend, batch, rows, q=rig.rand(t, 4, 64) * 2,
                                   kv=(k, rig.rand(t, 2, 64)))
        failures += close(f"lazy rescaling, key growth {growth}", out, want)
    try:
        TritonBackend(Rig(page=1, ratio=4, dim=64, seed=0).pool, 4,
                      kernel_config=KernelConfig(extend_row_heads=3))
        failures.append("extend_row_heads=3 with a group of 4 was accepted")
    except ValueError:
        pass

    # an fp8 pool with per-layer scales: extend over a prefix, then split decode
    for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
        rig = Rig(page=16, ratio=2, dim=64, seed=4, dtype=fmt)
        rig.pool.k_scale[0], rig.pool.v_scale[0] = 0.02, 0.5
        backend = TritonBackend(rig.pool, 2, num_kv_splits=3, kernel_config=KernelConfig(
            extend_block_m=16, extend_block_n=16, decode_block_n=16))
        rows = [rig.builder.new_request() for _ in range(2)]
        batch = rig.builder.extend([(rows[0], [1] * 37), (rows[1], [1] * 5)])
        out, want, _, _ = rig.step(backend, batch, rows)
        failures += close(f"fp8 ({fmt}) extend", out, want)
        batch = rig.builder.extend([(rows[0], [1] * 9), (rows[1], [1] * 20)])
        out, want, _, _ = rig.step(backend, batch, rows)
        failures += close(f"fp8 ({fmt}) extend over a prefix", out, want)
        batch = rig.builder.decode([(r, 2) for r in rows])
        out, want, _, _ = rig.step(backend, batch, rows)
        failures += close(f"fp8 ({fmt}) split decode", out, want)
    return failures + output_codes_checks() + paged_tile_checks()


def output_codes_checks() -> list[str]:
    """A decode's output written by the merge kernel as fp8 codes per head
    (``attend_codes``, a block fp8 output projection's input): what ``quant_groups`` makes of
    the output rows, bit for bit; declined (``None``) where no merge kernel runs or the group
    is not a head."""
    from engine.runtime import quant_triton as qt

    failures: list[str] = []
    os.environ["ENGINE_TRITON_OUTPUT_CODES"] = "1"
    rig = Rig(page=16, ratio=4, dim=64, seed=21, dtype=torch.float16)
    backend = TritonBackend(rig.pool, 4, num_kv_splits=4,
                            kernel_config=KernelConfig(decode_block_n=16))
    rows = [rig.builder.new_request() for _ in range(3)]
    rig.step(backend, rig.builder.extend([(r, [1] * n) for r, n in zip(rows, (1, 17, 70))]),
             rows, q=rig.rand(88, 8, 64).half(), kv=(rig.rand(88, 2, 64).half(),
                                                     rig.rand(88, 2, 64).half()))
    batch = rig.builder.decode([(r, 2) for r in rows])
    q = rig.rand(3, 8, 64).half()
    out, _, _, _ = rig.step(backend, batch, rows, q=q, kv=(rig.rand(3, 2, 64).half(),
                                                           rig.rand(3, 2, 64).half()))
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        got = backend.attend_codes(q, rig.spec, batch, (fp8, 64))
        want_codes, want_scales = qt.quant_groups(out.reshape(3, -1), fp8, 64)
        if got is None:
            failures.append(f"output codes {fp8}: declined")
            continue
        if not (torch.equal(got.codes.view(torch.uint8), want_codes.view(torch.uint8))
                and torch.equal(got.scales, want_scales) and got.scales.stride() == (1, 3)
                and got.dtype == torch.float16 and got.group == 64):
            failures.append(f"output codes {fp8}: not quant_groups' of the output")
    if backend.attend_codes(q, rig.spec, batch, (torch.float8_e4m3fn, 32)) is not None:
        failures.append("output codes in groups of half a head: not declined")
    one = TritonBackend(rig.pool, 4, num_kv_splits=1,
                        kernel_config=KernelConfig(decode_block_n=16))
    one.prepare(batch)
    if one.attend_codes(q, rig.spec, batch, (torch.float8_e4m3fn, 64)) is not None:
        failures.append("output codes without a merge kernel: not declined")
    os.environ["ENGINE_TRITON_OUTPUT_CODES"] = "0"
    if backend.attend_codes(q, rig.spec, batch, (torch.float8_e4m3fn, 64)) is not None:
        failures.append("output codes with ENGINE_TRITON_OUTPUT_CODES=0: not declined")
    os.environ.pop("ENGINE_TRITON_OUTPUT_CODES")
    return failures


def paged_tile_checks() -> list[str]:
    """Extend's whole key tiles read through the pages (``_page_slots``, one table entry per
    page or per tile): a page holding several tiles (64 over 16 and 32 keys, through pointers
    and through tensor descriptors), tiles of several pages (16 and 4 under 32 and 16 keys), and
    the per-key fallback (24 and 16: neither divides the other); ragged requests over several
    pages, then prefixes not a multiple of the page, then one tile per request (split prefix
    keys), with GQA, head dims 64 and 128, an fp8 pool through descriptors, and the launch a
    page of whole 64-key tiles gets by default (64 x 64 tiles of one query head, descriptors)."""
    failures: list[str] = []
    cases = [(64, 16, False, 3, 64, torch.float32), (64, 32, True, 2, 128, torch.float32),
             (16, 32, False, 4, 64, torch.float32), (4, 16, False, 2, 64, torch.float32),
             (24, 16, False, 1, 64, torch.float32),
             (64, 32, True, 2, 64, torch.float8_e4m3fn)]
    for seed, (page, bn, tma, ratio, dim, dtype) in enumerate(cases):
        name = f"paged tiles page={page} BLOCK_N={bn} tma={tma} gqa={ratio} dim={dim} {dtype}"
        cfg = KernelConfig(extend_block_m=32 if ratio <= 2 else 64, extend_block_n=bn,
                           extend_tma=tma)
        failures += _paged_tile_case(name, seed, page, ratio, dim, dtype, cfg)
    name = "paged tiles page=64: the default launch of 64-key pages"
    failures += _paged_tile_case(name, len(cases), 64, 4, 64, torch.float32,
                                 default_config(64, interpreted=False))
    # this forward's K/V read as their own rows (descriptors), the prefix through the pool:
    # pages of one slot (shuffled), of part of a tile and of whole tiles
    for seed, (page, heads, bn) in enumerate(((1, 0, 16), (16, 1, 32), (64, 0, 32))):
        cfg = KernelConfig(extend_block_m=64, extend_block_n=bn, extend_tma=True,
                           extend_row_heads=heads, extend_new_kv=True, extend_q_desc=False)
        name = f"new K/V rows page={page} BLOCK_N={bn} row_heads={heads}"
        failures += _paged_tile_case(name, 20 + seed, page, 4, 64, torch.float32, cfg,
                                     rows_read=True)
    # and the query tile through a descriptor of q (the default; one head a tile, the group's
    # heads)
    for seed, (page, heads) in enumerate(((16, 1), (1, 0))):
        cfg = KernelConfig(extend_block_m=64, extend_block_n=32, extend_tma=True,
                           extend_row_heads=heads, extend_new_kv=True, extend_q_desc=True)
        name = f"q descriptor page={page} row_heads={heads}"
        failures += _paged_tile_case(name, 30 + seed, page, 4, 64, torch.float32, cfg,
                                     rows_read=True)
    return failures


def _paged_tile_case(name: str, seed: int, page: int, ratio: int, dim: int, dtype: torch.dtype,
                     cfg: KernelConfig, rows_read: bool = False) -> list[str]:
    """``rows_read``: the first step (tiles of several) must read its new K/V as rows (a step
    of one tile per request splits its keys, and splits read the pool)."""
    failures: list[str] = []
    rig = Rig(page=page, ratio=ratio, dim=dim, seed=10 + seed, dtype=dtype)
    if rig.pool.is_fp8:
        rig.pool.k_scale[0], rig.pool.v_scale[0] = 0.02, 0.5
    backend = TritonBackend(rig.pool, ratio, kernel_config=cfg)
    built: list[bool] = []
    make_rows = backend._new_kv_descriptors

    def spy(*args):
        descs = make_rows(*args)
        built.append(descs is not None)
        return descs

    backend._new_kv_descriptors = spy  # type: ignore[method-assign]
    rows = [rig.builder.new_request() for _ in range(3)]
    steps = ((150, 7, 70), (41, 60, 1), (3, 5, 2)) if page > 4 else (  # a 256-slot pool
        (90, 7, 40), (30, 45, 1), (3, 5, 2))
    for step, lengths in enumerate(steps):
        batch = rig.builder.extend([(r, [1] * n) for r, n in zip(rows, lengths)])
        out, want, _, _ = rig.step(backend, batch, rows)
        if step == 2 and batch.attn_metadata.num_splits < 2:
            failures.append(f"{name}: one tile per request was not split")
        failures += close(f"{name} step {step}", out, want)
    if rows_read and built[:1] != [True]:
        failures.append(f"{name}: the new K/V were not read as rows ({built})")
    return failures

if __name__ == "__main__":
    mode = sys.argv[1]
    result = run_kit(*sys.argv[2:6]) if mode == "kit" else own_checks()
    print(json.dumps(result))
