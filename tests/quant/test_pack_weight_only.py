"""Which weight-only layers keep their codes packed (:func:`pack_weight_only`): by default only
on a CUDA device and for the code widths whose packed products were measured no slower than the
dense copy; ``ENGINE_PACKED_WEIGHT_ONLY`` forces either way."""

import pytest
import torch

from engine.runtime import quant_triton as qt
from engine.runtime.quant_methods import AffineShards, AffineWeight, pack_weight_only


def _weight(bits: int) -> AffineWeight:
    codes = torch.randint(0, 1 << bits, (8, 64))
    return AffineWeight(codes, torch.ones(8, 2), torch.zeros(8, 2), bits, 32)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_default_packs_measured_widths_on_cuda_only(monkeypatch, bits):
    monkeypatch.delenv("ENGINE_PACKED_WEIGHT_ONLY", raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pack_weight_only(cuda, _weight(bits).bits) == (bits in qt.PACKED_BITS)
    assert not pack_weight_only(cpu, bits)
    shards = AffineShards([_weight(bits), _weight(bits)])
    assert pack_weight_only(cuda, shards.bits) == (bits in qt.PACKED_BITS)
    # before repacking: whether any width may be kept
    assert pack_weight_only(cuda) == bool(qt.PACKED_BITS)
    assert not pack_weight_only(cpu)


@pytest.mark.parametrize("choice,want", [("1", True), ("0", False)])
def test_the_environment_forces_either_way(monkeypatch, choice, want):
    monkeypatch.setenv("ENGINE_PACKED_WEIGHT_ONLY", choice)
    for device in ("cpu", "cuda"):
        assert pack_weight_only(torch.device(device)) is want
        for bits in (2, 4, 8):
            assert pack_weight_only(torch.device(device), _weight(bits).bits) is want


# ---------------------------------------------------------------- the constants' compact form

def _gptq_like(groups: int = 4, n: int = 24, bits: int = 4):
    gen = torch.Generator().manual_seed(1)
    s = (torch.rand(groups, n, generator=gen) * 0.02 + 1e-3).half().float()
    z = torch.randint(0, 1 << bits, (groups, n), generator=gen).float()
    return s, -(z * s), z


def test_integer_zero_points_keep_16_bit_scales_and_ratios(monkeypatch):
    from engine.runtime.quant_methods import compact_constants

    monkeypatch.delenv("ENGINE_AFFINE_COMPACT", raising=False)
    s, b, z = _gptq_like()
    s16, r16 = compact_constants(s, b)
    assert (s16.dtype, r16.dtype) == (torch.float16, torch.float16)
    assert torch.equal(s16.float(), s) and torch.equal(r16.float(), -z)
    assert torch.equal(s16.float() * r16.float(), b)  # the kernels' float32 product
    # scales that only bfloat16 holds exactly (compressed-tensors' bf16 checkpoints)
    sb = (torch.rand(4, 24) * 1e3 + 7e4).bfloat16().float()
    s16, r16 = compact_constants(sb, -8.0 * sb)
    assert s16.dtype == torch.bfloat16 and torch.equal(r16.float(), torch.full_like(sb, -8.0))
    # zero scales with zero biases (an all-zero group) stay exact
    s[0], b[0] = 0.0, 0.0
    s16, r16 = compact_constants(s, b)
    assert s16.dtype == torch.float16 and torch.equal(s16.float() * r16.float(), b)


def test_constants_without_an_exact_compact_form_stay_float32(monkeypatch):
    from engine.runtime.quant_methods import compact_constants

    monkeypatch.delenv("ENGINE_AFFINE_COMPACT", raising=False)
    s, b, _ = _gptq_like()
    cases = {"free biases (MLX)": (s, torch.randn(s.shape)),
             "float32 scales": (torch.rand(4, 24) * 0.02 + 1e-3, b),
             "a zero scale under a bias": (s.clone().index_fill_(1, torch.tensor([3]), 0.0), b),
             "not finite": (s, b.clone().fill_(float("nan")))}
    for name, (scale, bias) in cases.items():
        got = compact_constants(scale, bias)
        assert got[0] is scale and got[1] is bias, name
    monkeypatch.setenv("ENGINE_AFFINE_COMPACT", "0")
    got = compact_constants(s, b)
    assert got[0] is s and got[1] is b


def test_packing_an_affine_weight_compacts_its_constants(monkeypatch):
    monkeypatch.delenv("ENGINE_AFFINE_COMPACT", raising=False)
    s, b, _ = _gptq_like(groups=2, n=8)
    w = AffineWeight(torch.randint(0, 16, (8, 64)), s.t(), b.t(), 4, 32).pack()
    assert w.codes is None and w.scale.dtype == torch.float16 and w.bias.dtype == torch.float16
    assert torch.equal(w.scale.float() * w.bias.float(), b)
