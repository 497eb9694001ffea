"""int8 W8A8 layers above ``INT8_KERNEL_ROWS`` rows on a GPU: the rows' codes from the Triton
quantizer, then cuBLAS's integer product (``torch._int_mm`` over the kernel's own [N, K] codes
seen transposed), against the Triton product of the same codes (skipped without CUDA)."""

from __future__ import annotations

import importlib

import pytest
import torch

from engine.runtime import quant_methods as qm
from engine.testing import quant as tq

PARTS = {"q_proj": 1024, "k_proj": 256, "v_proj": 256}


@pytest.mark.gpu
@pytest.mark.parametrize("static", [False, True])
def test_int8_rows_above_the_kernel_rows_take_the_integer_product(monkeypatch, static):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gen = torch.Generator().manual_seed(0)
    prefix = "model.layers.0.self_attn"
    dense = {f"{prefix}.{p}.weight": torch.randn(n, 1024, generator=gen) / 32
             for p, n in PARTS.items()}
    tensors, cfg, _ = tq.quantize_state(dense, "ct_w8a8_int8")
    if static:
        for group in cfg["config_groups"].values():
            group["input_activations"].update(dynamic=False, strategy="tensor")
        for p in PARTS:
            tensors[f"{prefix}.{p}.input_scale"] = torch.tensor([0.03])
    hook = importlib.import_module("engine_quant_w8a8_int8.impl").engine_create_quant_method
    method = hook(quant_config=cfg).for_layer(f"{prefix}.qkv_proj")
    with torch.device("cuda"):
        layer = tq.load_fused_layer(method, {n: t.cuda() for n, t in tensors.items()}, prefix,
                                    PARTS, 1024, torch.bfloat16)
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
