"""``--quantization humming``: gptq, awq and fp8 checkpoints through humming-kernels' GEMMs (CUDA
and the humming-kernels package; skipped without them). Here too: its refusals, and what each
layer hands humming, which need neither."""

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


@pytest.fixture
def handed(monkeypatch):
    """What each layer would hand humming (weight config, tensors, input config), captured in
    place of building a HummingLayer (which needs CUDA)."""
    import engine_quant_humming.impl as impl

    seen = []

    def capture(method, layer, weight, tensors, act=None):
        seen.append((weight, tensors, act))
        return torch.nn.Identity()

    monkeypatch.setattr(impl, "_humming_layer", capture)
    return seen


def _load(scheme, handed, **kw):
    gen = torch.Generator().manual_seed(0)
    tensors, cfg, _ = quantized(tq.qkv_weights(gen), scheme, **kw)
    method = _hook()(quant_config=cfg).for_layer("model.layers.0.self_attn.qkv_proj")
    tq.load_fused_layer(method, tensors, "model.layers.0.self_attn", tq.QKV_PARTS, 576,
                        torch.bfloat16)
    return tensors, handed[-1]


def test_gptq_v1_zeros_reach_humming_with_their_offset(handed):
    """Asymmetric GPTQ v1 stores each zero minus one: humming gets the zeros themselves,
    packed as the checkpoint packs them; symmetric checkpoints hand over no zeros."""
    from engine.runtime import quant_formats as qf

    tensors, (weight, given, act) = _load("gptq", handed, group=32, sym=False)
    stored = torch.cat([tensors[f"model.layers.0.self_attn.{p}.qzeros"]
                        for p in tq.QKV_PARTS], 1)
    assert weight == {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False,
                      "sym": False} and act is None
    assert torch.equal(qf.unpack_int32(given["qzeros"], 4, 1),
                       qf.unpack_int32(stored, 4, 1) + 1)
    _, (weight, given, _) = _load("gptq", handed, group=32)
    assert weight["sym"] and "qzeros" not in given


def test_a_v1_zero_that_does_not_fit_the_bits_is_refused(handed):
    from engine.runtime import quant_formats as qf

    gen = torch.Generator().manual_seed(0)
    tensors, cfg, _ = tq.quantize_state(tq.qkv_weights(gen), "gptq", group=32, sym=False)
    name = "model.layers.0.self_attn.k_proj.qzeros"
    zeros = qf.unpack_int32(tensors[name], 4, 1)
    zeros[0, 0] = 15  # a stored zero - 1 of 15: the zero 16
    tensors[name] = qf.pack_int32(zeros.to(torch.int32), 4, 1)
    method = _hook()(quant_config=cfg).for_layer("model.layers.0.self_attn.qkv_proj")
    with pytest.raises(ConfigError, match="does not fit 4 bits"):
        tq.load_fused_layer(method, tensors, "model.layers.0.self_attn", tq.QKV_PARTS, 576,
                            torch.bfloat16)


def test_fp8_reaches_humming_in_its_own_schema(handed):
    """Block fp8: float32 block scales and humming's block group sizes, activations per 1 x
    block_k group; per-tensor fp8 with dynamic activations: channel scales (each fused shard's
    scale on its rows), activations per token."""
    _, (weight, given, act) = _load("fp8_block", handed, block=(64, 64))
    assert weight == {"quant_method": "humming", "b_dtype": "float8e4m3",
                      "weight_scale_group_size": 64, "weight_scale_group_size_n": 64}
    assert given["weight"].dtype == torch.int32 and given["weight"].shape == (960, 576 // 4)
    assert given["weight_scale"].dtype == torch.float32 and given["weight_scale"].shape == (15, 9)
    assert act["input_quant_mode"] == "dynamic_group" and act["input_scale_group_size"] == 64
    tensors, (weight, given, act) = _load("fp8_dynamic", handed)
    assert weight == {"quant_method": "humming", "b_dtype": "float8e4m3"}
    scales = [float(tensors[f"model.layers.0.self_attn.{p}.weight_scale"]) for p in tq.QKV_PARTS]
    want = torch.cat([torch.full((n, 1), s) for s, n in zip(scales, tq.QKV_PARTS.values())])
    assert torch.equal(given["weight_scale"], want)
    assert act["input_quant_mode"] == "dynamic_token"
