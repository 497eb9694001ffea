"""How fast can a Triton causal prefill kernel be on this GPU, with none of the paged pool's
costs? A plain flash-attention forward over contiguous K/V (tensor descriptors for every
operand, the heaviest query tiles launched first, whole key tiles unmasked and only the
diagonal ones masked), in two row layouts:

* ``mha``: a program's BLOCK_M query rows are BLOCK_M tokens of one query head;
* ``gqa``: they are BLOCK_M / G tokens times the G query heads of one KV head (the layout of
  the triton attention plugin's extend kernel: each K/V tile is read once for the group);

and with the softmax state rescaled at every key tile or only when a row's maximum grows by
more than 2^8 (``lazy``).

Swept over tiles, warps and stages, next to torch SDPA on the same tensors, at the issue's
shape (8 requests x 1024 tokens, 32 query / 8 KV heads, head dim 128, bfloat16). The result
bounds what the paged extend kernel (``benchmarks/attention_gpu.py --sections prefill``) can
reach by restructuring alone.

    python3 benchmarks/prefill_ceiling_gpu.py [--batch 8 --tokens 1024] [--only 64x64x4x3]
        [--layouts mha,gqa] [--no-lazy]
    TRITON_INTERPRET=1 python3 benchmarks/prefill_ceiling_gpu.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import triton
import triton.language as tl


@triton.jit
def _step(q, k_desc, v_desc, row, col, m_i, l_i, acc, scale, tok, n0, MASKED: tl.constexpr,
          LAZY: tl.constexpr):
    """One key tile (rows ``row..`` of K and V at column ``col``) into the online softmax.
    MASKED: keys past a row's token are dropped (the diagonal). LAZY: the maxima (and the
    rescaling) move only when one grows by more than 2^8."""
    k = k_desc.load([row, col])
    qk = tl.dot(q, tl.trans(k))
    if MASKED:
        BLOCK_N: tl.constexpr = k.shape[0]
        keep = (n0 + tl.arange(0, BLOCK_N))[None, :] <= tok[:, None]
        qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
    v = v_desc.load([row, col])
    if LAZY:
        if tl.max(m_new - m_i, 0) > 8.0:
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
        p = tl.exp2(qk * scale - m_i[:, None])
        acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i + tl.sum(p, 1)
    else:
        p = tl.exp2(qk * scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _fa_fwd(q_desc, k_desc, v_desc, o_desc, T, scale,
            H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, GQA: tl.constexpr, M_TILES: tl.constexpr,
            LAZY: tl.constexpr = False):
    G: tl.constexpr = H // HKV
    TT: tl.constexpr = BLOCK_M // G if GQA else BLOCK_M  # tokens of a query tile
    mt = M_TILES - 1 - tl.program_id(0)  # the tiles with the most keys first
    bh = tl.program_id(1)
    t0 = mt * TT
    offs = tl.arange(0, BLOCK_M)
    if GQA:
        b = bh // HKV
        kvh = bh % HKV
        # a [TT, G, D] block of the [tokens, heads, D] view (a TMA box is at most 256 a
        # side, so not [TT, G * D])
        q = tl.reshape(q_desc.load([b * T + t0, kvh * G, 0]), (BLOCK_M, D))
        tok = t0 + offs // G
    else:
        b = bh // H
        h = bh % H
        kvh = h // G
        q = q_desc.load([b * T + t0, h * D])
        tok = t0 + offs
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    row0 = b * T
    full = t0 - t0 % BLOCK_N
    for n0 in range(0, full, BLOCK_N):  # every row sees every key: no mask
        m_i, l_i, acc = _step(q, k_desc, v_desc, row0 + n0, kvh * D, m_i, l_i, acc, scale,
                              tok, n0, False, LAZY)
    for n0 in range(full, t0 + TT, BLOCK_N):  # the diagonal: causal mask
        m_i, l_i, acc = _step(q, k_desc, v_desc, row0 + n0, kvh * D, m_i, l_i, acc, scale,
                              tok, n0, True, False)
    out = (acc / l_i[:, None]).to(q.dtype)
    if GQA:
        o_desc.store([row0 + t0, kvh * G, 0], tl.reshape(out, (TT, G, D)))
    else:
        o_desc.store([row0 + t0, h * D], out)


def fa_fwd(q, k, v, batch, tokens, heads, kv_heads, cfg, layout, lazy=False):
    """q [batch * tokens, heads * D], k/v [batch * tokens, kv_heads * D] -> o like q."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, warps, stages = cfg
    d = q.shape[1] // heads
    g = heads // kv_heads
    gqa = layout == "gqa"
    tt = bm // g if gqa else bm
    if tokens % tt or tt % bn and bn % tt:
        raise ValueError("tiles must divide the tokens")
    o = torch.empty_like(q)
    if gqa:  # [tokens, heads, D] views, [TT, G, D] blocks
        qd = TensorDescriptor.from_tensor(q.view(-1, heads, d), [tt, g, d])
        od = TensorDescriptor.from_tensor(o.view(-1, heads, d), [tt, g, d])
    else:
        qd = TensorDescriptor.from_tensor(q, [bm, d])
        od = TensorDescriptor.from_tensor(o, [bm, d])
    descs = [qd, TensorDescriptor.from_tensor(k, [bn, d]),
             TensorDescriptor.from_tensor(v, [bn, d]), od]
    grid = (tokens // tt, batch * (kv_heads if gqa else heads))
    _fa_fwd[grid](*descs, tokens, 1.0 / math.sqrt(d) * 1.4426950408889634, H=heads,
                  HKV=kv_heads, D=d, BLOCK_M=bm, BLOCK_N=bn, GQA=gqa, M_TILES=tokens // tt,
                  LAZY=lazy, num_warps=warps, num_stages=stages)
    return o


def reference(q, k, v, batch, tokens, heads, kv_heads):
    d = q.shape[1] // heads
    qh = q.view(batch, tokens, heads, d).transpose(1, 2)
    kh = k.view(batch, tokens, kv_heads, d).transpose(1, 2)
    vh = v.view(batch, tokens, kv_heads, d).transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                         enable_gqa=True)
    return o.transpose(1, 2).reshape(batch * tokens, heads * d)


#: the first LAZY_CONFIGS of them also run with the lazy rescaling (the softmax state moved
#: only when a row's maximum grows by more than 2^8)
LAZY_CONFIGS = 4
CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 2),
           (128, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2),
           (128, 128, 4, 2), (256, 64, 8, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--only", default="",
                    help="launches to run, e.g. 64x64x4x3,128x64x8x3 (default: the sweep)")
    ap.add_argument("--layouts", default="mha,gqa")
    ap.add_argument("--no-lazy", action="store_true", help="skip the lazy-rescaling runs")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes under TRITON_INTERPRET=1: correctness of both layouts")
    args = ap.parse_args()
    if args.cpu_smoke:
        assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
        dev, b, t, h, hkv, d = "cpu", 2, 64, 4, 2, 16
        configs = [(32, 16, 4, 1), (16, 16, 4, 1)]
    else:
        dev, b, t, h, hkv, d = ("cuda", args.batch, args.tokens, args.heads, args.kv_heads,
                                args.head_dim)
        configs = CONFIGS
    if args.only:
        configs = [tuple(int(v) for v in c.split("x")) for c in args.only.split(",")]
    torch.manual_seed(0)
    # (the interpreter multiplies bfloat16 operands wrongly: float16 there)
    dt = torch.float16 if dev == "cpu" else torch.bfloat16
    q = torch.randn(b * t, h * d, device=dev, dtype=dt)
    k = torch.randn(b * t, hkv * d, device=dev, dtype=dt)
    v = torch.randn(b * t, hkv * d, device=dev, dtype=dt)
    ref = reference(q.float(), k.float(), v.float(), b, t, h, hkv)
    flops = 4 * b * h * t * t * d / 2
    rows = []
    if dev == "cuda":
        from triton.testing import do_bench

        ms = do_bench(lambda: reference(q, k, v, b, t, h, hkv), warmup=50, rep=300)
        rows.append(("sdpa", "-", ms, flops / ms / 1e9, 0.0))
    layouts = args.layouts.split(",")
    runs = [(layout, cfg, False) for layout in layouts for cfg in configs]
    if not args.no_lazy:
        runs += [(layout, cfg, True) for layout in layouts for cfg in configs[:LAZY_CONFIGS]]
    for layout, cfg, lazy in runs:
        name = layout + (" lazy" if lazy else "")
        try:
            out = fa_fwd(q, k, v, b, t, h, hkv, cfg, layout, lazy)
            err = (out.float() - ref).abs().max().item()
            if dev == "cuda":
                ms = do_bench(lambda: fa_fwd(q, k, v, b, t, h, hkv, cfg, layout, lazy),
                              warmup=50, rep=300)
            else:
                ms = float("nan")
        except Exception as exc:  # noqa: BLE001 - a launch that does not fit is skipped
            print(f"{name} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        rows.append((name, "x".join(map(str, cfg)), ms, flops / ms / 1e9, err))
    print(f"causal prefill {b} x {t}, {h} q / {hkv} kv heads, head dim {d}, bf16")
    print("| kernel | BLOCK_M x BLOCK_N x warps x stages | ms | TFLOP/s | max err vs fp32 |")
    print("|---|---|---|---|---|")
    for layout, cfg, ms, tf, err in rows:
        print(f"| {layout} | {cfg} | {ms:.3f} | {tf:.1f} | {err:.2e} |")
    if dev == "cpu":
        bad = [r for r in rows if not r[4] < 2e-2]
        assert not bad, bad
        print("cpu smoke: ok")


if __name__ == "__main__":
    main()
