"""4-bit weights in PyTorch's own int4 layout (``ENGINE_W4_INT4PACK=1``,
:class:`Int4PackWeight`): the canonical affine form's codes, scales and biases carried over, so
its products equal the float32 product of the dequantized weight within bfloat16 rounding; the
switch's conditions; the layout's CUDA kernel against the Triton one on a GPU."""

import pytest
import torch

from engine.runtime import quant_triton as qt
from engine.runtime.quant_methods import (AffineShards, AffineWeight, Int4PackWeight,
                                          int4pack_form)


def _affine(n: int, k: int, group: int, sym: bool, perm: bool = False, seed: int = 0
            ) -> AffineWeight:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    # scales as a float16 checkpoint stores them, and bfloat16 holds them exactly
    scale = (torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3).to(torch.bfloat16).float()
    zeros = torch.full_like(scale, 8) if sym else torch.randint(0, 16, scale.shape,
                                                                  generator=gen).float()
    order = torch.randperm(k, generator=gen) if perm else None
    return AffineWeight(codes, scale, -zeros * scale, 4, group, order)


def _reference(aw: AffineWeight, x: torch.Tensor) -> torch.Tensor:
    """float32 x @ W^T of the canonical form (x's columns in the weight's order)."""
    w = qt.dequant_affine(aw.q, aw.scale, aw.bias, 4, aw.group, aw.sub, aw.k, torch.float32) \
        if aw.scale.is_cuda else _dequant_cpu(aw)
    x = x.float() if aw.perm is None else x.float().index_select(1, aw.perm.long())
    return x @ w.t()


def _dequant_cpu(aw: AffineWeight) -> torch.Tensor:
    codes = aw.codes.float()
    s = aw.scale.t().repeat_interleave(aw.group, 1)
    b = aw.bias.t().repeat_interleave(aw.group, 1)
    return codes * s + b


@pytest.mark.parametrize("sym,group,rows", [(True, 128, 1), (True, 32, 5), (False, 64, 3),
                                            (False, 256, 16)])
def test_products_equal_the_dequantized_float_reference(sym, group, rows):
    aw = _affine(64, 512, group, sym)
    x = torch.randn(rows, 512).to(torch.bfloat16)
    got = Int4PackWeight(aw, 8).matmul(x, None).float()
    want = _reference(aw, x)
    # bfloat16 output (and, asymmetric, the zero rounded to bfloat16)
    tol = (2 ** -8 if sym else 2 ** -7) * want.abs().max()
    assert got.shape == (rows, 64)
    assert (got - want).abs().max() <= tol


def test_act_order_columns_and_a_bias():
    aw = _affine(32, 256, 32, True, perm=True, seed=1)
    x = torch.randn(2, 3, 256).to(torch.bfloat16)
    bias = torch.randn(32).to(torch.bfloat16)
    got = Int4PackWeight(aw, 8).matmul(x, bias).float()
    want = _reference(aw, x.reshape(6, 256)).reshape(2, 3, 32) + bias.float()
    assert got.shape == (2, 3, 32)
    assert (got - want).abs().max() <= 2 ** -7 * want.abs().max()


def test_the_switch_takes_served_weights_only(monkeypatch):
    aw = _affine(64, 256, 128, True)
    assert int4pack_form(aw, torch.bfloat16) is None  # off by default
    monkeypatch.setenv("ENGINE_W4_INT4PACK", "1")
    assert isinstance(int4pack_form(aw, torch.bfloat16), Int4PackWeight)
    assert int4pack_form(aw, torch.float16) is None  # bfloat16 activations only
    for other in (AffineWeight(torch.randint(0, 256, (64, 256)), torch.ones(64, 2),
                               torch.zeros(64, 2), 8, 128),  # 8-bit codes
                  _affine(60, 256, 128, True),  # N not a multiple of 8
                  _affine(64, 192, 64, True),  # K not a multiple of 16 x 8 tiles
                  AffineWeight(torch.randint(0, 16, (64, 256)), torch.ones(64, 16),
                               torch.zeros(64, 16), 4, 16)):  # group of 16
        assert int4pack_form(other, torch.bfloat16) is None
    shards = AffineShards([_affine(32, 256, 64, True, perm=True, seed=2),
                           _affine(16, 256, 64, True, perm=True, seed=3)])
    form = int4pack_form(shards, torch.bfloat16)
    assert isinstance(form, AffineShards) and form.widths == [32, 16]
    assert all(isinstance(p, Int4PackWeight) for p in form.parts)
    x = torch.randn(3, 256).to(torch.bfloat16)
    want = torch.cat([_reference(p, x) for p in shards.parts], -1)
    assert (form.matmul(x, None).float() - want).abs().max() <= 2 ** -8 * want.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sym,rows,strided", [(True, 1, False), (False, 4, True),
                                               (True, 32, False), (False, 200, True)])
def test_cuda_kernel_against_the_reference_and_the_triton_product(sym, rows, strided):
    """``strided``: the codes a transposed view, as a checkpoint's unpacked codes can be."""
    torch.manual_seed(0)
    aw = _affine(1024, 4096, 128, sym)
    codes = aw.codes.cuda()
    codes = codes.t().contiguous().t() if strided else codes
    aw = AffineWeight(codes, aw.scale.t().cuda(), aw.bias.t().cuda(), 4, 128)
    x = torch.randn(rows, 4096, device="cuda").to(torch.bfloat16)
    want = _reference(aw, x)
    got = Int4PackWeight(aw, 8).matmul(x, None).float()
    triton = aw.matmul(x, None).float()
    tol = 2 ** -7 * want.abs().max()
    assert (got - want).abs().max() <= tol
    assert (triton - want).abs().max() <= tol


@pytest.mark.parametrize("desc_act", [False, True])
def test_a_gptq_checkpoint_loads_into_the_layout(monkeypatch, desc_act):
    """A fused q/k/v GPTQ layer (4-bit, group 128, act order or not) loaded through its plugin
    with the codes kept packed (the Triton interpreter stands for the GPU) and the switch on:
    its product is the checkpoint's float32 product within bfloat16 rounding."""
    import importlib

    from engine.testing import quant as tq

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ENGINE_PACKED_WEIGHT_ONLY", "1")
    monkeypatch.setenv("ENGINE_W4_INT4PACK", "1")
    parts = {"q_proj": 128, "k_proj": 64, "v_proj": 64}
    gen = torch.Generator().manual_seed(4)
    dense = {f"model.layers.0.self_attn.{p}.weight": torch.randn(n, 256, generator=gen) / 16
             for p, n in parts.items()}
    tensors, qcfg, ref = tq.quantize_state(dense, "gptq", group=128, desc_act=desc_act)
    impl = importlib.import_module("engine_quant_gptq.impl")
    method = impl.engine_create_quant_method(quant_config={"quant_method": "", **qcfg})
    tensors = dict(method.checkpoint_weights(iter(tensors.items())))
    layer = tq.load_fused_layer(method.for_layer("model.layers.0.self_attn.qkv_proj"), tensors,
                                "model.layers.0.self_attn", parts, 256, torch.bfloat16)
    form = layer.packed
    assert all(isinstance(p, Int4PackWeight) for p in getattr(form, "parts", [form]))
    x = torch.randn(3, 256, generator=gen).to(torch.bfloat16)
    w = torch.cat([ref[k] for k in dense])
    want = x.float() @ w.t()
    assert (layer(x).float() - want).abs().max() <= 2 ** -7 * want.abs().max()
