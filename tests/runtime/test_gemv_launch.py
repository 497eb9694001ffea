"""The matrix-vector kernels' launch table: a launch found for an exact weight shape comes
before its shape class's."""

import pytest

pytest.importorskip("triton")

from engine.runtime import gemv_triton as gt  # noqa: E402
from engine.runtime.quant_triton import shape_class  # noqa: E402


def test_an_exact_shape_comes_before_its_class(monkeypatch):
    assert gt.launch("float", 128, 2048) == gt.CONFIGS[("float", shape_class(128, 2048))]
    monkeypatch.setitem(gt.SHAPE_CONFIGS, ("float", 128, 2048), (8, 512, 4, 4, 2))
    assert gt.launch("float", 128, 2048) == (8, 512, 4, 4, 2)
    assert gt.launch("w8", 128, 2048) == gt.CONFIGS[("w8", "deep")]  # per kind
    assert gt.launch("float", 256, 2048) == gt.CONFIGS[("float", "deep")]
