"""4- and 8-bit weight-only layers on the CPU multiply their packed codes for a few rows
(:class:`CpuAffineWeight`, ``fused_cpu.affine``): the dequantized weight's float32 product up
to the order of additions, each row's result independent of the others, the dense copy for
many rows, and the layers that keep it dense."""

import importlib

import pytest
import torch

from engine.runtime import fused_cpu
from engine.runtime.quant_methods import (CPU_AFFINE_LARGE, CPU_AFFINE_ROWS,
                                          CPU_AFFINE_ROWS_LARGE, AffineShards,
                                          CpuAffineWeight, cpu_affine_rows)
from engine.testing import quant as tq

pytestmark = pytest.mark.skipif(not fused_cpu.available(), reason="needs the CPU kernels")


def _nibbles(codes: torch.Tensor) -> torch.Tensor:
    n, k = codes.shape
    c = codes.to(torch.uint8).reshape(n, k // 32, 2, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def _packed(codes: torch.Tensor, bits: int) -> torch.Tensor:
    return _nibbles(codes) if bits == 4 else codes.to(torch.uint8).contiguous()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n,k,group,rows", [(64, 256, 32, 1), (48, 512, 128, 3), (100, 1024, 64, 5),
                                            (33, 4096, 128, 12), (16, 2048, 2048, 2)])
def test_affine_is_the_dequantized_product(n, k, group, rows, bits):
    gen = torch.Generator().manual_seed(n)
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen)
    scale = torch.rand(n, k // group, generator=gen) * 0.02
    bias_ = torch.randn(n, k // group, generator=gen) * 0.05
    w = codes.double() * scale.double().repeat_interleave(group, 1) \
        + bias_.double().repeat_interleave(group, 1)
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    q = _packed(codes, bits)
    got = fused_cpu.affine(x, q, bits, scale, bias_, group, bias)
    want = x.double() @ w.t() + bias.double()
    assert (got.double() - want).abs().max() <= 1e-6 * want.abs().max()
    # each row alone gives its row of the batch, bit for bit
    alone = torch.cat([fused_cpu.affine(x[i:i + 1], q, bits, scale, bias_, group, bias)
                       for i in range(rows)])
    assert torch.equal(got, alone)


def _layer(scheme: str, monkeypatch, parts: dict[str, int] | None = None, **kw):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the CPU path, not the kernels'
    parts = parts or {"q_proj": 128, "k_proj": 64, "v_proj": 64}
    gen = torch.Generator().manual_seed(7)
    dense = {f"model.layers.0.self_attn.{p}.weight": torch.randn(n, 256, generator=gen) / 16
             for p, n in parts.items()}
    tensors, qcfg, ref = tq.quantize_state(dense, scheme, **kw)
    choice = tq.CHOICE.get(scheme, scheme)
    impl = importlib.import_module(f"engine_quant_{choice.replace('-', '_')}.impl")
    method = impl.engine_create_quant_method(
        quant_config={"quant_method": "", **tq.normalized_config(scheme, qcfg)})
    tensors = dict(method.checkpoint_weights(iter(tensors.items())))
    layer = tq.load_fused_layer(method.for_layer("model.layers.0.self_attn.qkv_proj"), tensors,
                                "model.layers.0.self_attn", parts, 256, torch.float32)
    return layer, torch.cat([ref[k] for k in dense])


@pytest.mark.parametrize("scheme,kw", [("gptq", {"group": 64}),
                                       ("gptq", {"group": 128, "desc_act": True}),
                                       ("gptq", {"group": 64, "bits": 8}),
                                       ("awq", {"group": 64, "sym": False}),
                                       ("ct_wna16", {"group": 32}), ("mlx4", {"group": 64}),
                                       ("mlx8", {"group": 32}), ("ct_w8a16", {})])
def test_layers_multiply_their_codes_for_a_few_rows(monkeypatch, scheme, kw):
    layer, w = _layer(scheme, monkeypatch, **kw)
    form = layer.cpu_packed
    assert all(isinstance(p, CpuAffineWeight) for p in getattr(form, "parts", [form]))
    assert cpu_affine_rows(layer.in_features * layer.out_features) == CPU_AFFINE_ROWS  # small
    x = torch.randn(CPU_AFFINE_ROWS + 4, 256, generator=torch.Generator().manual_seed(1))
    want = x.double() @ w.double().t()
    for rows in (1, 3, CPU_AFFINE_ROWS, CPU_AFFINE_ROWS + 1, CPU_AFFINE_ROWS + 4):
        got = layer(x[:rows])
        assert (got.double() - want[:rows]).abs().max() <= 1e-5 * want.abs().max()
    few = x[:CPU_AFFINE_ROWS]
    assert torch.equal(layer(few), form.matmul(few, None))
    # more rows than that: the dense copy's product, as before
    many = x[:CPU_AFFINE_ROWS + 1]
    assert torch.equal(layer(many), torch.nn.functional.linear(many, layer.weight))


def test_large_layers_multiply_more_rows_packed():
    assert cpu_affine_rows(CPU_AFFINE_LARGE - 1) == CPU_AFFINE_ROWS
    assert cpu_affine_rows(CPU_AFFINE_LARGE) == CPU_AFFINE_ROWS_LARGE > CPU_AFFINE_ROWS


def test_the_packed_form_is_off_on_request_and_for_other_widths(monkeypatch):
    monkeypatch.setenv("ENGINE_CPU_PACKED_AFFINE", "0")
    assert _layer("gptq", monkeypatch, group=64)[0].cpu_packed is None
    monkeypatch.delenv("ENGINE_CPU_PACKED_AFFINE")
    assert _layer("gptq", monkeypatch, group=64, bits=2)[0].cpu_packed is None
    assert _layer("gptq", monkeypatch, group=16)[0].cpu_packed is None  # groups of 32 and up


def test_act_order_shards_quantized_apart_each_take_the_form():
    from engine.runtime.quant_methods import AffineWeight, cpu_affine_form, cpu_affine_serves

    gen = torch.Generator().manual_seed(3)
    parts = []
    for n in (32, 16):
        perm = torch.randperm(128, generator=gen)
        parts.append(AffineWeight(torch.randint(0, 16, (n, 128), generator=gen),
                                  torch.rand(n, 2, generator=gen), torch.rand(n, 2, generator=gen),
                                  4, 64, perm))
    assert cpu_affine_serves(torch.device("cpu"), torch.float32)
    form = cpu_affine_form(AffineShards(parts))
    assert isinstance(form, AffineShards) and form.widths == [32, 16]
    x = torch.randn(2, 128, generator=gen)
    got = form.matmul(x, None)
    for part, (lo, hi) in zip(form.parts, ((0, 32), (32, 48))):
        codes = torch.stack([(part.codes.reshape(-1, 4, 16) & 15),
                             (part.codes.reshape(-1, 4, 16) >> 4)], 2).reshape(-1, 128)
        w = codes.double() * part.scale.double().repeat_interleave(64, 1) \
            + part.bias.double().repeat_interleave(64, 1)
        want = x.double()[:, part.perm.long()] @ w.t()
        assert (got[:, lo:hi].double() - want).abs().max() <= 1e-6 * want.abs().max()
