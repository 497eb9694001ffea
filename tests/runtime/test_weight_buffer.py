"""engine.api.native.weight_buffer: memory for weights CPU kernels stream every step."""

from __future__ import annotations

import mmap

import pytest
import torch

from engine.api import native


def test_buffers_are_aligned_disjoint_and_usable():
    """Each buffer has its shape and dtype, starts on 64 bytes, and none overlaps another
    (small ones share a map, large ones get their own)."""
    shapes = [((3, 5), torch.uint8), ((1000,), torch.float32), ((7,), torch.int16),
              ((17 << 20,), torch.uint8), ((64, 64), torch.float16)]
    bufs = [native.weight_buffer(shape, dtype) for shape, dtype in shapes]
    spans = []
    for (shape, dtype), buf in zip(shapes, bufs):
        assert tuple(buf.shape) == shape and buf.dtype is dtype and buf.is_contiguous()
        assert buf.data_ptr() % 64 == 0
        buf.fill_(3)
        spans.append((buf.data_ptr(), buf.data_ptr() + buf.nbytes))
    assert all(int(b.min()) == 3 for b in bufs)  # no buffer wrote over another
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no transparent huge pages")
def test_buffers_start_on_huge_pages_where_a_map_begins():
    big = native.weight_buffer((native.HUGE_PAGE * 5,))
    assert big.data_ptr() % native.HUGE_PAGE == 0


def test_switch_off_gives_plain_tensors(monkeypatch):
    monkeypatch.setenv("ENGINE_HUGE_PAGES", "0")
    buf = native.weight_buffer((4, 4), torch.float32)
    assert tuple(buf.shape) == (4, 4) and buf.dtype is torch.float32
