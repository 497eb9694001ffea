"""Which weight-only layers keep their codes packed (:func:`keep_packed`): by default only on a
CUDA device and for the code widths whose packed products were measured no slower than the
dense copy; ``ENGINE_PACKED_WEIGHT_ONLY`` forces either way."""

import pytest
import torch

from engine.runtime import quant_triton as qt
from engine.runtime.quant_methods import AffineShards, AffineWeight, keep_packed


def _weight(bits: int) -> AffineWeight:
    codes = torch.randint(0, 1 << bits, (8, 64))
    return AffineWeight(codes, torch.ones(8, 2), torch.zeros(8, 2), bits, 32)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_default_packs_measured_widths_on_cuda_only(monkeypatch, bits):
    monkeypatch.delenv("ENGINE_PACKED_WEIGHT_ONLY", raising=False)
    w = _weight(bits)
    assert keep_packed(w, torch.device("cuda")) == (bits in qt.PACKED_BITS)
    assert not keep_packed(w, torch.device("cpu"))
    shards = AffineShards([_weight(bits), _weight(bits)])
    assert keep_packed(shards, torch.device("cuda")) == (bits in qt.PACKED_BITS)


@pytest.mark.parametrize("choice,want", [("1", True), ("0", False)])
def test_the_environment_forces_either_way(monkeypatch, choice, want):
    monkeypatch.setenv("ENGINE_PACKED_WEIGHT_ONLY", choice)
    for bits in (2, 4, 8):
        for device in ("cpu", "cuda"):
            assert keep_packed(_weight(bits), torch.device(device)) is want
