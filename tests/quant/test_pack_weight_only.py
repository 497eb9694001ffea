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
