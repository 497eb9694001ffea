"""Which kernel one row of packed 4-bit codes goes to (:func:`engine.runtime.quant_triton.
affine_mm`): the swapped-operand kernel, except for the weight shapes of
``AFFINE_ONE_ROW_GEMV`` (the matrix-vector kernel measured faster there), and never for more
rows. The launches are recorded, not run."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.jit import JITFunction  # noqa: E402

from engine.runtime import quant_triton  # noqa: E402


def kernel_names(rows: int, n: int, k: int) -> list[str]:
    seen = []

    def getitem(kernel, grid):
        return lambda *args, **kwargs: seen.append(kernel.fn.__name__)

    q = torch.zeros(n, k // 8, dtype=torch.int32)
    s = torch.ones(k // 128, n)
    with mock.patch.object(JITFunction, "__getitem__", getitem):
        quant_triton.affine_mm(torch.zeros(rows, k, dtype=torch.bfloat16), q, s, s, 4, 128,
                               quant_triton.affine_sub(128))
    return seen


def test_one_row_goes_to_the_gemv_only_for_the_listed_shapes(monkeypatch):
    monkeypatch.setattr(quant_triton, "AFFINE_ONE_ROW_GEMV", {4: {(256, 512)}})
    assert kernel_names(1, 256, 512) == ["_gemv_affine"]
    assert kernel_names(1, 384, 512) == ["_affine_swap"]
    assert kernel_names(4, 256, 512) == ["_affine_swap"]
    monkeypatch.setattr(quant_triton, "AFFINE_ONE_ROW_GEMV", {})
    assert kernel_names(1, 256, 512) == ["_affine_swap"]

