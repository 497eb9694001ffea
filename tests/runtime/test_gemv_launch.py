"""The matrix-vector kernels' launch table: a launch found for an exact weight shape comes
before its shape class's."""

import pytest

pytest.importorskip("triton")

from engine.runtime import gemv_triton as gt  # noqa: E402
from engine.runtime.quant_triton import shape_class  # noqa: E402


def test_an_exact_shape_comes_before_its_class(monkeypatch):
    assert ("float", 96, 2048) not in gt.SHAPE_CONFIGS
    assert gt.launch("float", 96, 2048) == gt.CONFIGS[("float", shape_class(96, 2048))]
    monkeypatch.setitem(gt.SHAPE_CONFIGS, ("float", 96, 2048), (8, 512, 4, 4, 2))
    assert gt.launch("float", 96, 2048) == (8, 512, 4, 4, 2)
    assert gt.launch("w8", 96, 2048) == gt.CONFIGS[("w8", shape_class(96, 2048))]  # per kind
    assert gt.launch("float", 256, 2048) == gt.CONFIGS[("float", "deep")]


def test_the_searched_shapes_have_their_own_launches():
    # Qwen3-30B-A3B's router: the deep class's launch gives its 128 outputs 8 programs
    assert gt.launch("float", 128, 2048) == gt.SHAPE_CONFIGS[("float", 128, 2048)]
    assert gt.launch("float", 128, 2048) != gt.CONFIGS[("float", shape_class(128, 2048))]
