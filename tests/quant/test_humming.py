"""``--quantization humming``: gptq, awq and fp8 checkpoints through humming-kernels' GEMMs (CUDA
and the humming-kernels package; skipped without them). Here: its refusals, which need
neither."""

from __future__ import annotations

import pytest
import torch

from engine.errors import ConfigError
from engine.testing import quant as tq

#: (scheme written, its writer's options): symmetric and asymmetric GPTQ v1 (zeros stored minus
#: one), 8-bit GPTQ, asymmetric AWQ
CASES = [("gptq", {"group": 32}), ("gptq", {"group": 32, "sym": False}),
         ("gptq", {"bits": 8, "group": 64}), ("awq", {"group": 32, "sym": False}),
         ("fp8_block", {"block": (64, 64)}), ("fp8_dynamic", {})]
#: fp8 activations are quantized (per token or per 1 x 64 group): the kit's bound for them
ACT_QUANTIZED = {"fp8_block", "fp8_dynamic"}


def quantized(dense, scheme, **kw):
    """``quantize_state``, with ``fp8_dynamic``: the per-tensor fp8 checkpoint with dynamic
    activations (the writer's ``fp8_tensor`` has static ones)."""
    if scheme != "fp8_dynamic":
        return tq.quantize_state(dense, scheme, **kw)
    tensors, cfg, ref = tq.quantize_state(dense, "fp8_tensor", **kw)
    return ({n: t for n, t in tensors.items() if not n.endswith("input_scale")},
            {**cfg, "activation_scheme": "dynamic"}, ref)
#: (in_features, shards): SmolLM2's fused q/k/v (960 outputs, padded to 1024 inside humming),
#: and a Llama-like fused q/k/v of head dim 128
LAYERS = [(576, tq.QKV_PARTS), (1024, {"q_proj": 1024, "k_proj": 256, "v_proj": 256})]
#: the tiny model the serving test writes (widths of whole 128-wide tiles)
WIDTHS = dict(hidden=1024, heads=8, kv_heads=2, intermediate=2048)


def _hook():
    from engine_quant_humming.impl import engine_create_quant_method

    return engine_create_quant_method


def test_act_order_and_other_formats_are_refused_with_the_reason():
    hook = _hook()
    _, cfg, _ = tq.quantize_state({}, "gptq", desc_act=True)
    with pytest.raises(ConfigError, match="act-order"):
        hook(quant_config=cfg)
    _, cfg, _ = tq.quantize_state({}, "fp8_tensor")
    with pytest.raises(ConfigError, match="humming"):
        hook(quant_config=cfg)  # static activation scales
    _, cfg, _ = tq.quantize_state({}, "ct_w8a8_int8")
    with pytest.raises(ConfigError, match="humming"):
        hook(quant_config=cfg)


def test_a_float32_model_is_refused_naming_the_dtypes():
    hook = _hook()
    gen = torch.Generator().manual_seed(0)
    tensors, cfg, _ = tq.quantize_state(tq.qkv_weights(gen), "gptq", group=32)
    method = hook(quant_config=cfg).for_layer("model.layers.0.self_attn.qkv_proj")
    with pytest.raises(ConfigError, match="bfloat16"):
        tq.load_fused_layer(method, tensors, "model.layers.0.self_attn", tq.QKV_PARTS, 576)


@pytest.mark.gpu
@pytest.mark.parametrize("k,parts", LAYERS, ids=lambda c: str(c) if isinstance(c, int) else "")
@pytest.mark.parametrize("scheme,kw", CASES, ids=lambda c: str(c))
def test_the_layer_equals_the_dequantized_reference_on_the_gpu(scheme, kw, k, parts):
    """A fused q/k/v layer loaded shard by shard as the model loader does: humming's product
    against x @ W_ref^T in float64 (W_ref the format's own values), within bf16 rounding of the
    output; one row and several."""
    pytest.importorskip("humming")
    gen = torch.Generator().manual_seed(0)
    prefix = "model.layers.0.self_attn"
    dense = {f"{prefix}.{p}.weight": torch.randn(n, k, generator=gen) * k ** -0.5
             for p, n in parts.items()}
    if scheme == "fp8_block" and k == 1024:
        kw = {"block": (128, 128)}
    tensors, cfg, ref = quantized(dense, scheme, **kw)
    method = _hook()(quant_config=cfg).for_layer(f"{prefix}.qkv_proj")
    with torch.device("cuda"):
        layer = tq.load_fused_layer(method, {n: v.cuda() for n, v in tensors.items()},
                                    prefix, parts, k, torch.bfloat16)
    w = torch.cat([ref[n] for n in dense]).double()
    for rows in (1, 7, 64):
        x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        got = layer(x.cuda()).double().cpu()
        want = x.double() @ w.T
        scale = (x.double().abs() @ w.abs().T).max().item()
        tol = 0.05 if scheme in ACT_QUANTIZED else 1e-2
        assert (got - want).abs().max().item() <= tol * scale, (rows, scheme, kw)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["gptq", "awq", "fp8_block"])
def test_the_model_serves_as_gptq_and_awq_do_on_the_gpu(tmp_path, scheme):
    """The tiny Llama written as a gptq / awq / block fp8 checkpoint, served in bf16 with
    ``--quantization humming`` and with the format's own choice: prefill and decode logits
    close, greedy tokens equal (CUDA graphs on)."""
    pytest.importorskip("humming")
    from test_kv_cache_dtype import run

    src, dst = str(tmp_path / "dense"), str(tmp_path / "q")
    tq.tiny_llama(src, **WIDTHS)
    tq.write_checkpoint(src, dst, scheme, group=32, sym=scheme == "gptq")
    got, runner = run(dst, "auto", device="cuda", dtype="bfloat16", quantization="humming")
    want, _ = run(dst, "auto", device="cuda", dtype="bfloat16", quantization=tq.CHOICE[scheme])
    assert any(hasattr(m, "humming") for m in runner.model.modules())
    got, want = got.float(), want.float()
    assert (got - want).abs().max().item() <= 0.03 * want.abs().max().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
