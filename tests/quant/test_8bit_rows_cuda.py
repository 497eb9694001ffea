"""8-bit layers past the swapped kernel's 16 rows on a GPU (skipped without CUDA):

- block fp8 (128 x 128 weight blocks, 1 x 128 activation groups) on SM90+ takes
  ``torch._scaled_mm``'s block-scaled product (the default; ``ENGINE_FP8_BLOCK_SCALED_MM=0``
  turns it off), against the format's own arithmetic and against ``w8_mm``;
- int8 W8A8 above ``INT8_KERNEL_ROWS`` rows (an A/B switch) takes cuBLAS's integer product
  (the rows' codes from the Triton quantizer, ``torch._int_mm`` over the kernel's own [N, K]
  codes seen transposed), against the Triton product of the same codes."""

from __future__ import annotations

import importlib

import pytest
import torch

from engine.runtime import quant_formats as qf
from engine.runtime import quant_methods as qm
from engine.testing import quant as tq

PARTS = {"q_proj": 1024, "k_proj": 256, "v_proj": 256}
PREFIX = "model.layers.0.self_attn"


def _qkv_layer(gen: torch.Generator, scheme: str, plugin: str, static_input: float | None = None,
               **kw):
    """A fused bfloat16 q/k/v layer on the GPU quantized by ``scheme`` and loaded through the
    ``plugin`` choice (``static_input``: int8 activations with that static scale); and the
    float32 reference weights [N, K]."""
    dense = {f"{PREFIX}.{p}.weight": torch.randn(n, 1024, generator=gen) / 32
             for p, n in PARTS.items()}
    tensors, cfg, ref = tq.quantize_state(dense, scheme, **kw)
    if static_input is not None:
        for group in cfg["config_groups"].values():
            group["input_activations"].update(dynamic=False, strategy="tensor")
        for p in PARTS:
            tensors[f"{PREFIX}.{p}.input_scale"] = torch.tensor([static_input])
    hook = importlib.import_module(f"engine_quant_{plugin}.impl").engine_create_quant_method
    method = hook(quant_config=cfg).for_layer(f"{PREFIX}.qkv_proj")
    with torch.device("cuda"):
        layer = tq.load_fused_layer(method, {n: t.cuda() for n, t in tensors.items()}, PREFIX,
                                    PARTS, 1024, torch.bfloat16)
    return layer, torch.cat([ref[n] for n in dense])


@pytest.mark.gpu
def test_block_fp8_rows_above_16_take_the_block_scaled_product(monkeypatch):
    monkeypatch.delenv("ENGINE_FP8_BLOCK_SCALED_MM", raising=False)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an SM90+ GPU")
    gen = torch.Generator().manual_seed(0)
    layer, w = _qkv_layer(gen, "fp8_block", "fp8", block=(128, 128))
    assert layer.block_scaled
    w = w.double()
    for rows in (17, 32, 100):
        x = torch.randn(rows, 1024, generator=gen).to(torch.bfloat16)
        got = layer(x.cuda()).double().cpu()
        codes, scales = qf.quantize_fp8_groups(x, torch.float8_e4m3fn, 128)
        xq = (codes.double().reshape(rows, 8, 128) * scales.double()[..., None]).reshape(rows, -1)
        want = xq @ w.T
        scale = (xq.abs() @ w.abs().T).max().item()
        assert (got - want).abs().max().item() <= 1e-2 * scale, rows
        kernel = layer.quant_method._kernel_apply(layer, x.cuda(), None).double().cpu()
        assert (got - kernel).abs().max().item() <= 1e-2 * scale, rows


@pytest.mark.gpu
@pytest.mark.parametrize("static", [False, True])
def test_int8_rows_above_the_kernel_rows_take_the_integer_product(monkeypatch, static):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gen = torch.Generator().manual_seed(0)
    layer, _ = _qkv_layer(gen, "ct_w8a8_int8", "w8a8_int8", 0.03 if static else None)
    assert layer.kernel
    for rows in (17, 40, 128):
        x = torch.randn(rows, 1024, generator=gen).to(torch.bfloat16).cuda()
        monkeypatch.setattr(qm, "INT8_KERNEL_ROWS", 1 << 30)
        kernel = layer(x).float()
        monkeypatch.setattr(qm, "INT8_KERNEL_ROWS", 16)
        cublas = layer(x).float()
        # the same integer sums and scales: equal but for the last rounding to bfloat16
        scale = kernel.abs().max().item()
        assert (cublas - kernel).abs().max().item() <= 1e-2 * scale, rows
