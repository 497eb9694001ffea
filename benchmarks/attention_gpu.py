"""Attention backends on a GPU: conformance, decode bandwidth, prefill throughput. One script.

Run on the GPU machine from the repository root, without installing entry points::

    PYTHONPATH=core:plugins/attention/torch_native:plugins/attention/triton:\
plugins/attention/flex_attention:plugins/attention/flashinfer \
    CUDA_HOME=/usr/local/cuda FLASHINFER_CUDA_ARCH_LIST=9.0a python benchmarks/attention_gpu.py

Sections (each survives the failure of another; errors are printed and recorded):

(a) conformance kit (``engine.testing.attention.check``) for torch_native, triton,
    flex_attention, flashinfer in bfloat16 on CUDA (page sizes 1 and 16), then our own page-64
    check (the kit's request table has 256 columns, too few for its 5-page request at 64);
(b) decode kernel: bf16, 32 q / 8 kv heads, head dim 128, page 16, shuffled pages, random K/V;
    batch 32 x 4096 and 128 x 2048 context. Median time (``triton.testing.do_bench``, L2 flushed
    between runs), GB/s of K+V bytes read and % of 4.3 TB/s, for triton (shipped launch
    parameters, then the best of a small sweep), flashinfer (tensor-core decode, planned outside
    the timing as once per batch) and torch_native;
(c) extend/prefill 8 x 1024 causal, no prefix: TFLOP/s (causal FLOPs, 4 * H * D * L(L+1)/2 per
    request) for triton (shipped, then best of a sweep), flashinfer and torch SDPA on contiguous
    tensors, at each page size of ``--page-sizes`` (default 16; ``16,64``: also 64-token
    pages, where a page holds whole key tiles and the sweep adds its TMA configurations).
    Every swept configuration is logged (and kept in the JSON's ``sweeps``); one whose output
    differs from the reference is marked and never chosen as the best.

Prints a table at the end; with ``OUT`` set, writes ``$OUT/attention_gpu.json``.
``--cpu-smoke`` runs every section with tiny shapes on the CPU (triton under TRITON_INTERPRET=1)
to check the script itself; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

PEAK_BYTES_PER_S = 4.3e12  # measured device copy ceiling of the H200 (read + write)


@dataclass
class Shapes:
    device: str
    dtype_name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    page: int
    decode: tuple[tuple[int, int], ...]  #: (batch, context)
    prefill: tuple[int, int]  #: (batch, length)


GPU = Shapes("cuda", "bfloat16", 32, 8, 128, 16, ((32, 4096), (128, 2048)), (8, 1024))
SMOKE = Shapes("cpu", "float32", 4, 2, 64, 16, ((2, 48),), (2, 40))

RESULTS: dict[str, Any] = {"conformance": {}, "decode": [], "prefill": [], "sweeps": [],
                           "errors": []}


def log(msg: str) -> None:
    print(msg, flush=True)


def guarded(name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # one section's failure must not stop the others
        line = f"{name}: {type(exc).__name__}: {exc}"
        log(f"ERROR {line}")
        traceback.print_exc()
        RESULTS["errors"].append(line)
        return None


# ---------------------------------------------------------------------------- backends

def hooks() -> dict[str, Callable[..., Any]]:
    """Each installed plugin's backend builder (through the start-up assembly, default
    options)."""
    import importlib

    from engine.testing import attention as kit

    out = {}
    for name, module in (("torch_native", "engine_attention_torch_native.impl"),
                         ("triton", "engine_attention_triton.impl"),
                         ("flex_attention", "engine_attention_flex_attention.impl"),
                         ("flashinfer", "engine_attention_flashinfer.impl")):
        try:
            importlib.import_module(module)
            out[name] = kit.plugin_backend(name)
        except Exception as exc:
            line = f"import {name}: {type(exc).__name__}: {exc}"
            log(f"ERROR {line}")
            RESULTS["errors"].append(line)
    return out


def model_config(s: Shapes) -> Any:
    from engine.models.config import ModelConfig

    return ModelConfig(architecture="LlamaForCausalLM", hidden_size=s.q_heads * s.head_dim,
                       intermediate_size=4, num_hidden_layers=1, num_attention_heads=s.q_heads,
                       num_key_value_heads=s.kv_heads, head_dim=s.head_dim, vocab_size=8,
                       max_position_embeddings=1 << 20)


def bench(fn: Callable[[], Any], device: str) -> float:
    """Median seconds of ``fn``."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[1]


# ---------------------------------------------------------------------------- (a) conformance

def conformance(s: Shapes, makers: dict[str, Callable[..., Any]]) -> None:
    from engine.testing import attention as kit

    if s.device == "cpu":  # smoke: one small case per backend
        kit.PAGE_SIZES, kit.GQA_RATIOS, kit.HEAD_DIMS = (16,), (3,), (64,)
    page_sets = [kit.PAGE_SIZES]
    base = kit.PAGE_SIZES
    for name, make in makers.items():
        if name == "flashinfer" and s.device != "cuda":
            RESULTS["conformance"][name] = "skipped: needs CUDA"
            continue
        failures: list[str] = []
        t = time.perf_counter()
        try:
            for pages in page_sets:
                kit.PAGE_SIZES = pages
                failures += kit.check(name, make, device=s.device)
        except Exception as exc:
            failures.append(f"raised {type(exc).__name__}: {exc}")
        finally:
            kit.PAGE_SIZES = base
        if not failures:  # the kit's table has 256 columns: page 64 is checked here instead
            failures += guarded(f"page-64 check {name}",
                                lambda: page64_check(s, name, make)) or []
        status = "pass" if not failures else f"FAIL ({len(failures)})"
        RESULTS["conformance"][name] = status if not failures else {
            "status": status, "first": failures[:5]}
        log(f"[conformance] {name}: {status} in {time.perf_counter() - t:.1f} s")
        for f in failures[:5]:
            log(f"    {f}")


def page64_check(s: Shapes, name: str, make: Callable[..., Any]) -> list[str]:
    """Extend over a cached prefix, then decode, with 64-token pages and GQA 4, head dims 64
    and 128, against the kit's float32 reference over the pool's contents."""
    import dataclasses

    import torch

    from engine.config import ServerConfig
    from engine.runtime.batch import ForwardMode
    from engine.testing.attention import TOLERANCES, reference

    failures = []
    dtype = getattr(torch, s.dtype_name)
    for dim in (64, 128):
        s64 = dataclasses.replace(s, page=64, head_dim=dim, q_heads=8, kv_heads=2)
        for new in (45, 1):  # extend (prefix 255) then decode (prefix 299)
            pool, batch, spec, q = paged_setup(s64, 3, 300, dtype, new)
            backend = make(pool=pool, model_config=model_config(s64),
                           config=ServerConfig(page_size=64, device=s.device))
            backend.prepare(batch)
            out = (backend.forward_decode if batch.mode is ForwardMode.DECODE
                   else backend.forward_extend)(q, spec, batch)
            atol, rtol = TOLERANCES[dtype]
            for i in range(3):
                slots = batch.req_to_token[i, :300]
                want = reference(q[i * new:(i + 1) * new], pool.k[0][slots], pool.v[0][slots],
                                 300 - new, spec.scaling)
                got = out[i * new:(i + 1) * new].float()
                if not torch.allclose(got, want, atol=atol, rtol=rtol):
                    failures.append(f"{name} page_size=64 head_dim={dim} new={new} request {i}: "
                                    f"max error {(got - want).abs().max().item():.3g}")
    return failures


# ---------------------------------------------------------------------------- fixtures

def paged_setup(s: Shapes, bsz: int, ctx: int, dtype: Any, new_tokens: int) -> tuple:
    """A one-layer pool with random K/V, shuffled pages, and a batch of ``bsz`` requests whose
    last ``new_tokens`` tokens are new (1 = decode) over ``ctx`` tokens of context in all."""
    import torch

    from engine.runtime.attention import AttentionLayerSpec, KVPool
    from engine.runtime.batch import Batch, ForwardMode

    ps, dev = s.page, torch.device(s.device)
    pages_per = -(-ctx // ps)
    num_pages = bsz * pages_per + 1
    pool = KVPool(num_layers=1, num_kv_heads=s.kv_heads, head_dim=s.head_dim,
                  num_slots=num_pages * ps, page_size=ps, dtype=dtype, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    for buf in pool.k + pool.v:
        buf.normal_(generator=gen)
    perm = torch.randperm(num_pages - 1, device=dev) + 1
    pages = perm.view(bsz, pages_per)
    r2t = (pages[:, :, None] * ps + torch.arange(ps, device=dev)).view(bsz, -1)[:, :ctx]
    req_to_token = r2t.contiguous()
    prefix = ctx - new_tokens
    i64 = dict(dtype=torch.int64, device=dev)
    batch = Batch(
        mode=ForwardMode.DECODE if new_tokens == 1 and prefix > 0 else ForwardMode.EXTEND,
        input_ids=torch.zeros(bsz * new_tokens, **i64),
        positions=torch.arange(prefix, ctx, device=dev).repeat(bsz),
        out_cache_loc=req_to_token[:, prefix:].reshape(-1),
        req_pool_indices=torch.arange(bsz, device=dev),
        seq_lens=torch.full((bsz,), ctx, **i64), prefix_lens=torch.full((bsz,), prefix, **i64),
        extend_lens=torch.full((bsz,), new_tokens, **i64), req_to_token=req_to_token,
        seq_lens_cpu=[ctx] * bsz, prefix_lens_cpu=[prefix] * bsz,
        extend_lens_cpu=[new_tokens] * bsz)
    spec = AttentionLayerSpec(0, s.q_heads, s.kv_heads, s.head_dim, s.head_dim ** -0.5)
    q = torch.randn(bsz * new_tokens, s.q_heads, s.head_dim, generator=gen, device=dev,
                    dtype=dtype)
    return pool, batch, spec, q


def reference_close(out: Any, want: Any) -> float:
    return float((out.float() - want.float()).abs().max())


# ---------------------------------------------------------------------------- (b) decode

TRITON_DECODE_SWEEP = [dict(decode_block_n=n, decode_warps=w, decode_stages=st)
                       for n, w, st in ((32, 4, 2), (64, 4, 2), (64, 8, 2), (128, 8, 2),
                                        (64, 4, 3))] + [
    dict(decode_block_n=64, decode_warps=4, decode_stages=3, decode_fused_merge=True)]


def decode_section(s: Shapes, makers: dict[str, Callable[..., Any]]) -> None:
    import torch

    from engine.config import ServerConfig

    dtype = getattr(torch, s.dtype_name)
    mc = model_config(s)
    for bsz, ctx in s.decode:
        pool, batch, spec, q = paged_setup(s, bsz, ctx, dtype, 1)
        kv_bytes = 2 * bsz * ctx * s.kv_heads * s.head_dim * pool.k[0].element_size()
        ref = None

        def record(backend_name: str, seconds: float, out: Any, note: str = "") -> None:
            err = reference_close(out, ref) if ref is not None else 0.0
            row = {"shape": f"{bsz}x{ctx}", "backend": backend_name, "ms": seconds * 1e3,
                   "GB/s": kv_bytes / seconds / 1e9,
                   "%peak": 100 * kv_bytes / seconds / PEAK_BYTES_PER_S,
                   "max_err_vs_torch_native": err, "note": note}
            RESULTS["decode"].append(row)
            log(f"[decode {bsz}x{ctx}] {backend_name:<22} {row['ms']:8.3f} ms "
                f"{row['GB/s']:8.1f} GB/s {row['%peak']:5.1f}%  err {err:.2e} {note}")

        cfg = ServerConfig(page_size=s.page, device=s.device)
        for name in ("torch_native", "triton", "flashinfer"):
            if name not in makers or (name == "flashinfer" and s.device != "cuda"):
                continue

            def run_one(name: str = name) -> None:
                nonlocal ref
                backend = makers[name](pool=pool, model_config=mc, config=cfg)
                backend.prepare(batch)
                fn = lambda: backend.forward_decode(q, spec, batch)  # noqa: E731
                out = fn()
                if name == "torch_native":
                    ref = out
                record(name, bench(fn, s.device), out)
                if name == "triton":
                    triton_sweep(backend, batch, fn, record, ref=ref,
                                 label=f"decode {bsz}x{ctx}")

            guarded(f"decode {bsz}x{ctx} {name}", run_one)
        del pool, batch


def triton_sweep(backend: Any, batch: Any, fn: Callable[[], Any], record: Callable[..., None],
                 sweep: list[dict[str, Any]] | None = None, splits_options: tuple = (None,),
                 ref: Any = None, label: str = "sweep") -> None:
    """Time ``fn`` under each launch configuration of ``sweep`` (the decode sweep by default;
    fields of ``KernelConfig`` over the shipped ones) and each split count of
    ``splits_options`` (None: the backend's own; the decode default tries 16 too), log each,
    keep them in ``RESULTS["sweeps"]``, and record the fastest one whose output matches
    ``ref`` (the kit's tolerances; a config that does not compile or launch is skipped)."""
    import torch

    from engine.testing.attention import TOLERANCES
    from engine_attention_triton.impl import KernelConfig

    if sweep is None:
        sweep = TRITON_DECODE_SWEEP
        splits_options = tuple(sorted({backend.num_kv_splits, 16}))
    shipped, shipped_splits, best = backend.cfg, backend.num_kv_splits, None
    for params in sweep:
        for splits in splits_options:
            backend.configure(KernelConfig(**{**shipped.__dict__, **params}))
            backend.num_kv_splits = shipped_splits if splits is None else splits
            tag = " ".join(f"{k.split('_', 1)[1]}={v}" for k, v in params.items()) + (
                "" if splits is None else f" splits={splits}")
            try:
                backend.prepare(batch)
                out = fn()
                t = bench(fn, "cuda" if out.is_cuda else "cpu")
            except Exception as exc:  # a config that does not compile (shared memory...)
                log(f"    {label} {tag}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            atol, rtol = TOLERANCES.get(out.dtype, (2e-2, 2e-2))
            ok = ref is None or torch.allclose(out.float(), ref.float(), atol=atol, rtol=rtol)
            RESULTS["sweeps"].append({"sweep": label, "config": tag, "ms": t * 1e3, "ok": ok})
            log(f"    {label} {tag}: {t * 1e3:.3f} ms{'' if ok else '  WRONG OUTPUT'}")
            if ok and (best is None or t < best[0]):
                best = (t, tag, out)
    backend.configure(shipped)
    backend.num_kv_splits = shipped_splits
    if best:
        record("triton (best of sweep)", best[0], best[2], best[1])


# ---------------------------------------------------------------------------- (c) prefill

def _extend(m: int, n: int, w: int, st: int, tma: bool = False, heads: int = 0,
            lazy: bool = False, index_asm: bool = True, new_kv: bool = False,
            q_desc: bool = False) -> dict[str, Any]:
    return dict(extend_block_m=m, extend_block_n=n, extend_warps=w, extend_stages=st,
                extend_tma=tma, extend_row_heads=heads, extend_lazy_rescale=lazy,
                extend_index_asm=index_asm, extend_new_kv=new_kv, extend_q_desc=q_desc)


#: prefill launch configurations (BLOCK_M query rows: BLOCK_M // G tokens x the group's heads;
#: BLOCK_N keys; warps; stages): 18 with pointer loads, then 6 with TMA descriptors, which run
#: only where a page holds whole key tiles (page size a multiple of BLOCK_N: 64, not 16). From
#: an offline sm_90 compile (triton 3.9): 128 x 64/128 on 4 warps spill registers and 4 stages
#: build the same kernel as 3, so neither is swept. Then tiles of one query head (BLOCK_M
#: tokens of one head, the plain flash-attention layout) and of half the group, and a few
#: launches with the lazy rescaling of the softmax state
TRITON_EXTEND_SWEEP = [_extend(*c) for c in (
    (128, 32, 4, 3), (128, 32, 4, 2), (128, 32, 8, 3), (128, 32, 8, 2), (128, 64, 8, 2),
    (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 32, 4, 3), (64, 32, 4, 2),
    (64, 32, 8, 3), (64, 32, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 2),
    (64, 64, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3),
    (128, 32, 4, 3, True), (128, 32, 8, 3, True), (128, 64, 8, 2, True), (128, 64, 8, 3, True),
    (64, 64, 4, 3, True), (64, 64, 8, 3, True),
    (128, 32, 4, 3, False, 1), (128, 64, 4, 3, False, 1), (128, 64, 8, 3, False, 1),
    (128, 128, 8, 2, False, 1), (128, 128, 8, 3, False, 1), (64, 64, 4, 3, False, 1),
    (128, 64, 8, 3, True, 1), (128, 128, 8, 2, True, 1), (64, 64, 4, 3, True, 1),
    (128, 32, 4, 3, False, 2), (128, 64, 8, 3, False, 2),
    (128, 32, 4, 3, False, 0, True), (128, 64, 8, 3, False, 0, True),
    (128, 64, 8, 3, False, 1, True), (128, 128, 8, 2, False, 1, True),
    (64, 64, 4, 3, True, 1, True))]

#: ``--short-sweep``: the shipped launch and the 64 x 64 ones, with the slot-table entries
#: read inside the pipeliner (index_asm False: K/V one tile ahead) and outside it (K/V
#: stages - 1 tiles ahead, so 4 stages differ from 3)
TRITON_EXTEND_SHORT = [_extend(*c) for c in (
    (128, 32, 4, 3, False, 0, False, False), (128, 32, 4, 3),
    (64, 64, 4, 3, False, 0, False, False), (64, 64, 4, 3), (64, 64, 4, 4),
    (64, 64, 4, 3, True, 0, False, False), (64, 64, 4, 3, True),
    (64, 64, 4, 4, True), (64, 64, 4, 3, True, 1), (64, 64, 4, 4, True, 1),
    (128, 64, 8, 3, True), (128, 64, 8, 4, True), (128, 128, 8, 3), (64, 32, 4, 4),
    (64, 32, 4, 3), (64, 64, 4, 3, False, 1),
    # this forward's K/V read as rows through descriptors (any page size)
    (64, 64, 4, 3, True, 1, False, True, True), (64, 64, 4, 3, True, 0, False, True, True),
    (64, 32, 4, 3, True, 0, False, True, True), (128, 64, 8, 3, True, 0, False, True, True),
    # the query tile by pointers / through a descriptor of q, alternating twice
    *[(m, n, 4, 3, True, heads, False, True, True, q_desc) for _ in range(2)
      for m, n, heads in ((64, 32, 0), (64, 64, 1)) for q_desc in (False, True)])]


def prefill_section(s: Shapes, makers: dict[str, Callable[..., Any]],
                    page_sizes: tuple[int, ...] = ()) -> None:
    """The prefill measurements once per page size (``page_sizes``, or the shapes' own)."""
    import dataclasses

    for page in page_sizes or (s.page,):
        guarded(f"prefill page {page}",
                lambda page=page: prefill_page(dataclasses.replace(s, page=page), makers))


def prefill_page(s: Shapes, makers: dict[str, Callable[..., Any]]) -> None:
    import torch
    import torch.nn.functional as F

    from engine.config import ServerConfig

    dtype = getattr(torch, s.dtype_name)
    bsz, length = s.prefill
    flops = 4 * bsz * s.q_heads * s.head_dim * length * (length + 1) / 2
    pool, batch, spec, q = paged_setup(s, bsz, length, dtype, length)
    ref = None
    shape = f"{bsz}x{length} p{s.page}"

    def record(name: str, seconds: float, out: Any, note: str = "") -> None:
        err = reference_close(out, ref) if ref is not None else 0.0
        row = {"shape": f"{shape} causal", "page": s.page, "backend": name,
               "ms": seconds * 1e3, "TFLOP/s": flops / seconds / 1e12, "max_err_vs_sdpa": err,
               "note": note}
        RESULTS["prefill"].append(row)
        log(f"[prefill {shape}] {name:<24} {row['ms']:8.3f} ms "
            f"{row['TFLOP/s']:7.1f} TFLOP/s  err {err:.2e} {note}")

    def sdpa() -> None:
        nonlocal ref
        slots = batch.req_to_token.reshape(-1)
        k = pool.k[0][slots].view(bsz, length, s.kv_heads, s.head_dim).transpose(1, 2)
        v = pool.v[0][slots].view(bsz, length, s.kv_heads, s.head_dim).transpose(1, 2)
        k, v = k.contiguous(), v.contiguous()
        qq = q.view(bsz, length, s.q_heads, s.head_dim).transpose(1, 2).contiguous()
        fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
            qq, k, v, is_causal=True, scale=spec.scaling, enable_gqa=True)
        out = fn()
        ref = out.transpose(1, 2).reshape(bsz * length, s.q_heads, s.head_dim)
        record("torch SDPA (contiguous)", bench(fn, s.device), ref)

    guarded(f"prefill {shape} sdpa", sdpa)
    cfg = ServerConfig(page_size=s.page, device=s.device)
    mc = model_config(s)
    for name in ("triton", "flashinfer"):
        if name not in makers or (name == "flashinfer" and s.device != "cuda"):
            continue

        def run_one(name: str = name) -> None:
            backend = makers[name](pool=pool, model_config=mc, config=cfg)
            backend.prepare(batch)
            if name == "triton":  # (this forward's K/V as the model would hand them over)
                slots = batch.req_to_token.reshape(-1)
                new_kv = (pool.k[0][slots], pool.v[0][slots])
                fn = lambda: backend.forward_extend(q, spec, batch, new_kv=new_kv)  # noqa: E731
            else:
                fn = lambda: backend.forward_extend(q, spec, batch)  # noqa: E731
            out = fn()
            record(name, bench(fn, s.device), out)
            if name == "triton":  # TMA configurations only where a page holds whole tiles
                sweep = [p for p in TRITON_EXTEND_SWEEP
                         if not p.get("extend_tma") or p.get("extend_new_kv")
                         or s.page % p["extend_block_n"] == 0]
                triton_sweep(backend, batch, fn, record, sweep, ref=ref,
                             label=f"prefill {shape}")

        guarded(f"prefill {shape} {name}", run_one)
    del pool, batch


# ---------------------------------------------------------------------------- main

def table() -> str:
    lines = ["", "== conformance =="]
    for name, status in RESULTS["conformance"].items():
        lines.append(f"  {name:<16} {status if isinstance(status, str) else status['status']}")
    lines += ["", "== decode (KV bytes read / time; % of 4.3 TB/s) ==",
              f"  {'shape':<10} {'backend':<24} {'ms':>9} {'GB/s':>9} {'%peak':>6}  note"]
    for r in RESULTS["decode"]:
        lines.append(f"  {r['shape']:<10} {r['backend']:<24} {r['ms']:9.3f} {r['GB/s']:9.1f} "
                     f"{r['%peak']:6.1f}  {r['note']}")
    lines += ["", "== extend/prefill (causal) ==",
              f"  {'shape':<22} {'backend':<24} {'ms':>9} {'TFLOP/s':>8}  note"]
    for r in RESULTS["prefill"]:
        lines.append(f"  {r['shape']:<22} {r['backend']:<24} {r['ms']:9.3f} "
                     f"{r['TFLOP/s']:8.1f}  {r['note']}")
    if RESULTS["errors"]:
        lines += ["", "== errors =="] + [f"  {e}" for e in RESULTS["errors"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes on CPU, triton under TRITON_INTERPRET=1 (checks the script)")
    ap.add_argument("--sections", default="conformance,decode,prefill",
                    help="comma-separated subset of conformance,decode,prefill")
    ap.add_argument("--no-sweep", action="store_true", help="only the shipped triton parameters")
    ap.add_argument("--short-sweep", action="store_true",
                    help="prefill: only TRITON_EXTEND_SHORT (slot-table reads in and out of the "
                         "pipeliner, the 64 x 64 launches)")
    ap.add_argument("--backends", default="torch_native,triton,flex_attention,flashinfer",
                    help="comma-separated subset of backends")
    ap.add_argument("--page-sizes", default="",
                    help="comma-separated KV page sizes of the prefill section (default: the "
                         "shapes' own, 16), e.g. 16,64")
    args = ap.parse_args()
    global TRITON_DECODE_SWEEP, TRITON_EXTEND_SWEEP
    if args.no_sweep:
        TRITON_DECODE_SWEEP, TRITON_EXTEND_SWEEP = [], []
    if args.short_sweep:
        TRITON_EXTEND_SWEEP = TRITON_EXTEND_SHORT
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere
        TRITON_DECODE_SWEEP = TRITON_DECODE_SWEEP[:1] + TRITON_DECODE_SWEEP[-1:]
        # the first, a TMA one and a one-head one
        TRITON_EXTEND_SWEEP = TRITON_EXTEND_SWEEP[:1] + [
            p for p in TRITON_EXTEND_SWEEP if p["extend_tma"]][-1:] + TRITON_EXTEND_SWEEP[-1:]
    s = SMOKE if args.cpu_smoke else GPU
    import torch

    if s.device == "cuda" and not torch.cuda.is_available():
        log("no CUDA device: use --cpu-smoke")
        return 2
    RESULTS["env"] = {"torch": torch.__version__, "device": (
        torch.cuda.get_device_name() if s.device == "cuda" else "cpu"), "shapes": s.__dict__}
    for mod in ("triton", "flashinfer"):
        try:
            RESULTS["env"][mod] = __import__(mod).__version__
        except Exception as exc:
            RESULTS["env"][mod] = f"unavailable ({type(exc).__name__})"
    log(json.dumps(RESULTS["env"]))
    makers = {k: v for k, v in hooks().items() if k in args.backends.split(",")}
    pages = tuple(int(p) for p in args.page_sizes.split(",") if p)
    sections = {"conformance": conformance, "decode": decode_section,
                "prefill": lambda s, makers: prefill_section(s, makers, pages)}
    for name in args.sections.split(","):
        guarded(name, lambda name=name: sections[name](s, makers))
    log(table())
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "attention_gpu.json")
        with open(path, "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
