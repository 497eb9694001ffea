"""The packed-weight products of :mod:`engine.runtime.quant_triton` against their formats'
float references: run under TRITON_INTERPRET=1 on a CPU (small shapes), or on a GPU. Prints one
JSON list of failures."""

import json
import os
import sys

import torch

os.environ["ENGINE_PACKED_WEIGHT_ONLY"] = "1"  # weight-only formats packed on the GPU too

from engine.runtime import quant_formats as qf
from engine.runtime import quant_triton as qt

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
failures: list[str] = []
gen = torch.Generator().manual_seed(0)
ROWS = (1, 3, 5, 20) if device == "cpu" else (1, 2, 3, 4, 7, 16, 33, 200)


def half(m, dot=False):
    """The activation dtype: bfloat16, but float16 for the interpreter's ``tl.dot`` (it
    multiplies bfloat16 operands as their raw bits; the affine product always uses it)."""
    return torch.float16 if device == "cpu" else torch.bfloat16


def rand(*shape):
    return torch.randn(*shape, generator=gen)


def close(name, got, want, rel=2 ** -7):
    """``got`` (rounded to its half-precision dtype) within a few units of that dtype of the
    float64 reference, relative to the output's largest magnitude (the interpreter rounds to
    bfloat16 by truncation: twice that)."""
    rel *= 2 if device == "cpu" else 1
    err = (got.double().cpu() - want.double().cpu()).abs()
    bound = rel * want.abs().double().max().item() + 1e-6
    if not torch.isfinite(got).all() or err.max().item() > bound:
        failures.append(f"{name}: max error {err.max().item():.4g} > {bound:.4g}")


def affine_case(bits, group, m, n=48, k=256, perm=False, dtype=None):
    dtype = dtype or half(m, dot=True)
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen)
    scale = rand(n, -(-k // group)).abs() * 0.02 + 0.001
    bias_ = rand(n, -(-k // group)) * 0.05
    w = (codes.float() * scale.repeat_interleave(group, 1)[:, :k]
         + bias_.repeat_interleave(group, 1)[:, :k])
    x = rand(m, k).to(dtype)
    p = torch.randperm(k, generator=gen) if perm else None
    sub = qt.affine_sub(group)
    packed = qt.pack_affine(codes, bits, sub)
    bias = rand(n).to(dtype)
    y = qt.affine_mm(x.to(device), packed.to(device), scale.t().contiguous().to(device),
                     bias_.t().contiguous().to(device), bits, group, sub,
                     perm=p.to(torch.int32).to(device) if p is not None else None,
                     bias=bias.to(device))
    xs = x.double()[:, p] if p is not None else x.double()
    want = xs @ w.to(dtype).double().t() + bias.double()
    close(f"affine bits={bits} group={group} m={m} k={k} perm={perm}", y, want)


def int8_case(m, n=48, k=256, static=False):
    x = rand(m, k).to(half(m))
    w = torch.randint(-128, 128, (n, k), generator=gen).to(torch.int8)
    ws = rand(n).abs() * 0.01 + 1e-3
    st = torch.tensor([0.03]) if static else None
    if static:
        ref_q, ref_s = qf.quantize_int8_static(x, st), st.expand(m)
    else:
        ref_q, ref_s = qf.quantize_int8_per_token(x)
        if m > 1:
            xq, xs = qt.quant_rows(x.to(device), torch.int8)
            if not torch.equal(xq.cpu(), ref_q) or not torch.equal(xs.cpu(), ref_s.reshape(-1)):
                failures.append(f"int8 codes m={m}: differ from the torch quantizer")
    y = qt.w8_mm(x.to(device), w.to(device), ws.to(device), act="static" if static else "token",
                 x_scale=st.to(device) if static else None, out_dtype=torch.float32)
    acc = (ref_q.long() @ w.long().t()).to(torch.float32)
    want = acc * ref_s.reshape(-1, 1) * ws.reshape(1, -1)
    if not torch.equal(y.cpu(), want):
        failures.append(f"int8 m={m} static={static}: not bit-exact "
                        f"({(y.cpu().float() - want.float()).abs().max():.3g})")


def fp8_case(m, n=48, k=256, act="token", block=None, fp8=torch.float8_e4m3fn):
    x = rand(m, k).to(half(m))
    w = (rand(n, k) * 40).clamp(-440, 440).to(fp8)
    if block is None:
        ws = rand(n).abs() * 0.01 + 1e-3
        wd = w.double() * ws.double().reshape(-1, 1)
    else:
        ws = rand(-(-n // block[0]), -(-k // block[1])).abs() * 0.01 + 1e-3
        wd = w.double() * qf.expand_blocks(ws, n, k, block).double()
    dev = lambda t: t.to(device)  # noqa: E731
    if act == "token":
        ref_s = qf.fp8_scale_per_token(x, fp8)
        ref_q = qf.quantize_fp8(x, ref_s, fp8)
        if m > 1:
            xq, xs = qt.quant_rows(dev(x), fp8)
            if not torch.equal(xq.cpu().view(torch.uint8), ref_q.view(torch.uint8)):
                failures.append(f"fp8 codes m={m}: differ from the torch quantizer")
        y = qt.w8_mm(dev(x), dev(w), dev(ws), act="token", block=block)
        want = (ref_q.double() * ref_s.double()) @ wd.t()
    elif act == "group":
        y = qt.w8_mm(dev(x), dev(w), dev(ws), act="group", block=block)
        want = qf.fake_quant_fp8(x, fp8, group=block[1]).double() @ wd.t()
    else:  # W8A16
        y = qt.w8_mm(dev(x), dev(w), dev(ws), block=block)
        want = x.double() @ wd.to(x.dtype).double().t()
    close(f"fp8 {act} m={m} block={block} {fp8}", y, want)


for m in ROWS:
    affine_case(4, 128, m)
    affine_case(4, 32, m, k=576)
    affine_case(8, 64, m)
    affine_case(2, 32, m, k=1024)
    int8_case(m)
    fp8_case(m)
    fp8_case(m, act="group", block=(128, 128), n=200, k=320)
    fp8_case(m, act="none", block=(128, 128), n=200, k=256)
    fp8_case(m, act="none")
affine_case(4, 64, 3, perm=True)
affine_case(4, 16, 2, k=96)
affine_case(4, 128, 20, perm=True, dtype=torch.float16)
# many rows: the weight dequantized into a temporary, then the dense product (every width)
_dequant_rows = dict(qt.DEQUANT_ROWS)
qt.DEQUANT_ROWS.update({2: 5, 4: 5, 8: 5})
for bits, group, m, perm in ((4, 128, 5, False), (8, 64, 9, True), (2, 32, 20, False),
                             (4, 16, 6, True)):
    affine_case(bits, group, m, k=320 if group < 128 else 256, perm=perm)
qt.DEQUANT_ROWS.clear()
qt.DEQUANT_ROWS.update(_dequant_rows)
int8_case(3, static=True)
fp8_case(2, fp8=torch.float8_e5m2)
fp8_case(20, fp8=torch.float8_e5m2)
fp8_case(3, act="token", block=(128, 128), n=256, k=256)
int8_case(20, static=True)
small = dict(qt.W8_SMALL)
for key, (path, _) in small.items():  # a few rows the other way, K in 3 slices
    qt.W8_SMALL[key] = ("dot" if path == "gemv" else "gemv", (16, 64, 3, 4, 2))
int8_case(3)
fp8_case(2)
int8_case(1)
int8_case(1, static=True)
fp8_case(1)
fp8_case(1, act="group", block=(128, 128), n=200, k=320)
fp8_case(1, act="none", block=(128, 128), n=200, k=256)
qt.W8_SMALL.update(small)
for key, (path, _) in small.items():  # and the chosen way, K in 3 slices
    qt.W8_SMALL[key] = (path, (16, 64, 3, 4, 2))
int8_case(1)
fp8_case(4)
fp8_case(1, act="group", block=(128, 128), n=200, k=320)
qt.W8_SMALL.update(small)

from engine.runtime import gemv_triton as gt  # noqa: E402

for m, split in ((1, 1), (3, 3), (4, 2)):  # the matrix-vector kernel directly, a few rows
    x = rand(m, 200).to(torch.bfloat16)
    w, bias = (rand(40, 200) * 0.1).to(torch.bfloat16), rand(40).to(torch.bfloat16)
    y = gt.gemv(x.to(device), w.to(device), bias=bias.to(device), config=(8, 64, split, 4, 2))
    close(f"gemv float m={m} split={split}", y, x.double() @ w.double().t() + bias.double())
    wq = (rand(40, 200) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
    ws = rand(40).abs() * 0.01 + 1e-3
    y = gt.gemv(x.to(device), wq.to(device), ws.to(device), act="token",
                config=(8, 64, split, 4, 2))
    ref_s = qf.fp8_scale_per_token(x, torch.float8_e4m3fn)
    want = (qf.quantize_fp8(x, ref_s, torch.float8_e4m3fn).double() * ref_s.double()) \
        @ (wq.double() * ws.double().reshape(-1, 1)).t()
    close(f"gemv fp8 token m={m} split={split}", y, want)
# one row with its weights loaded before the wait (the default for float weights): ragged
# outputs, K in one slice, in slices with a partial last one, the launch of each shape class
for n, k, config in ((40, 200, (4, 256, 4)), (37, 200, (8, 64, 4)), (40, 320, (2, 128, 2)),
                     (6, 4096 if device != "cpu" else 512, None)):
    x = rand(1, k).to(torch.bfloat16)
    w, bias = (rand(n, k) * 0.1).to(torch.bfloat16), rand(n).to(torch.bfloat16)
    y = gt.gemv_early(x.to(device), w.to(device), bias.to(device), config=config)[0]
    close(f"gemv early n={n} k={k} {config}", y, x.double() @ w.double().t() + bias.double())
    y = gt.gemv(x.to(device), w.to(device))  # (the default way for one row)
    close(f"gemv one row n={n} k={k}", y, x.double() @ w.double().t())
    y = gt.gemv(x.to(device), w.to(device), out_dtype=torch.float32)  # (not via bf16)
    close(f"gemv one row n={n} k={k} float32 out", y, x.double() @ w.double().t(), rel=2 ** -18)


def gemv_affine_case(bits, group, m, config, n=40, k=320, perm=False, bias=True,
                     round_weights=False):
    """:func:`gt.gemv_affine` at one launch (AFFINE_CONFIGS' fields) against the float64
    product of its float32 weights (rounded to x's dtype with ``round_weights``)."""
    groups = -(-k // group)
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen)
    scale = rand(groups, n).abs() * 0.02 + 0.001
    bias_ = rand(groups, n) * 0.05
    w = codes.float() * scale.t().repeat_interleave(group, 1)[:, :k] \
        + bias_.t().repeat_interleave(group, 1)[:, :k]
    x = rand(m, k).to(torch.bfloat16)
    p = torch.randperm(k, generator=gen) if perm else None
    sub = qt.affine_sub(group)
    b = rand(n).to(torch.bfloat16) if bias else None
    dev = lambda t: t.to(device) if t is not None else None  # noqa: E731
    y = gt.gemv_affine(dev(x), dev(qt.pack_affine(codes, bits, sub)), dev(scale), dev(bias_),
                       bits, group, sub, perm=dev(p.to(torch.int32) if perm else None),
                       bias=dev(b), round_weights=round_weights, config=config)
    w = w.to(x.dtype) if round_weights else w
    want = (x.double()[:, p] if perm else x.double()) @ w.double().t()
    close(f"gemv affine bits={bits} group={group} m={m} n={n} k={k} perm={perm} "
          f"config={config} round={round_weights}", y, want + (b.double() if bias else 0))


# launches: (BLOCK_N, SPLIT_K, warps, stages, TILES, FACTOR_ROWS, SUBNORMAL); TILES 0: the
# per-weight kernel
AFFINE_LAUNCHES = [(16, 1, 4, 1, 1, 4, 1),  # factored, subnormal codes, one slice of K
                   (16, 3, 8, 2, 4, 0, 1),  # each weight's affine, K in 3 slices, prefetch
                   (32, 2, 4, 2, 2, 4, 0),  # factored, codes 2^bits + q
                   (16, 2, 4, 2, 2, 0, 0),  # each weight's affine, codes 2^bits + q
                   (16, 2, 4, 2, 0, 0, 0)]  # the per-weight kernel
AFFINE_SHAPES = [  # (bits, group, n, k): groups in a tile, across tiles, K = group, padding
    (4, 128, 40, 320), (4, 64, 64, 512), (4, 32, 40, 288), (4, 16, 40, 96), (4, 256, 64, 1024),
    (4, 1024, 40, 1024), (4, 512, 40, 2048), (2, 32, 40, 640), (2, 128, 64, 1024),
    (8, 128, 40, 320), (8, 64, 64, 512), (8, 256, 40, 512), (4, 576, 40, 576)]
for i, (bits, group, n, k) in enumerate(AFFINE_SHAPES):
    for j, config in enumerate(AFFINE_LAUNCHES):
        gemv_affine_case(bits, group, 1 + (i + j) % 4, config, n=n, k=k, perm=(i + j) % 3 == 0,
                         bias=(i + j) % 2 == 0)
gemv_affine_case(4, 128, 3, None, round_weights=True)
gemv_affine_case(4, 64, 1, None, perm=True, round_weights=True)


# ---------------------------------------------------------------- layers of each format

def build_method(scheme, qcfg):
    """The plugin's method for a written scheme (its hook called with what it asks for)."""
    import importlib
    import inspect
    from types import SimpleNamespace

    from engine.config import ServerConfig
    from engine.testing import quant as tq

    impl = importlib.import_module(f"engine_quant_{tq.CHOICE[scheme].replace('-', '_')}.impl")
    hook = impl.engine_create_quant_method
    qc = tq.normalized_config(scheme, qcfg)
    given = {"quant_config": qc, "config": ServerConfig(), "device": torch.device(device),
             "model_config": SimpleNamespace(weights_format="safetensors",
                                             quantization_config=qc)}
    return hook(**{k: v for k, v in given.items() if k in inspect.signature(hook).parameters})


def layer_case(scheme, m, **kw):
    """The packed product of a fused q/k/v layer loaded through the plugin, against the same
    checkpoint served by the float32 CPU path (exact against the format's reference) on the
    same activations."""
    import os

    from engine.testing import quant as tq

    parts = {"q_proj": 128, "k_proj": 64, "v_proj": 64}
    k = 256
    dense = {f"model.layers.0.self_attn.{p}.weight": rand(n, k) * 0.05 for p, n in parts.items()}
    tensors, qcfg, _ = tq.quantize_state(dense, scheme, **kw)
    prefix, name = "model.layers.0.self_attn", "model.layers.0.self_attn.qkv_proj"
    dtype = half(m, dot=scheme in WEIGHT_ONLY)
    top = build_method(scheme, qcfg)
    tensors = dict(top.checkpoint_weights(iter(tensors.items())))
    on_dev = {key: t.to(device) for key, t in tensors.items()}
    with torch.device(device):
        fast = tq.load_fused_layer(top.for_layer(name), on_dev, prefix, parts, k, dtype)
    os.environ["ENGINE_DISABLE_QUANT_KERNELS"] = "1"
    try:
        ref = tq.load_fused_layer(build_method(scheme, qcfg).for_layer(name), tensors, prefix,
                                  parts, k, torch.float32)
    finally:
        del os.environ["ENGINE_DISABLE_QUANT_KERNELS"]
    kernel = getattr(fast, "packed", None) is not None or getattr(fast, "kernel", False)
    if not kernel:
        failures.append(f"layer {scheme}: not served by the packed kernels")
        return
    x = rand(m, k).to(dtype)
    close(f"layer {scheme} m={m}", fast(x.to(device)), ref(x.float()).double(), rel=2 ** -6)


WEIGHT_ONLY = ("gptq", "awq", "auto_round", "ct_wna16", "ct_w8a16", "mlx4", "mlx8")
LAYER_SCHEMES = {"gptq": {"desc_act": True, "group": 64}, "gptq8": {"bits": 8, "group": 128},
                 "awq": {"sym": False, "group": 64}, "auto_round": {},
                 "ct_wna16": {"sym": False, "group": 64}, "ct_w8a16": {}, "mlx4": {"group": 64},
                 "mlx8": {"group": 64}, "ct_w8a8_int8": {}, "ct_fp8_dynamic": {},
                 "ct_fp8_static": {}, "ct_fp8_block": {"block": (64, 64)},
                 "fp8_block": {"block": (64, 128)}, "fp8_tensor": {}, "modelopt_fp8": {},
                 "quark_fp8": {}}
for scheme, kw in LAYER_SCHEMES.items():
    for m in (1, 20):
        layer_case(scheme.rstrip("8") if scheme == "gptq8" else scheme, m, **kw)
print(json.dumps(failures))
