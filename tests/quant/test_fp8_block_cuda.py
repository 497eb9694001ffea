"""Block fp8 (128 x 128 weight blocks, 1 x 128 activation groups) above 16 rows on an SM90+ GPU
(the default; ``ENGINE_FP8_BLOCK_SCALED_MM=0`` turns it off): ``torch._scaled_mm``'s
block-scaled product, against the format's own arithmetic and against ``w8_mm`` (skipped
without CUDA)."""

from __future__ import annotations

import importlib

import pytest
import torch

from engine.runtime import quant_formats as qf
from engine.testing import quant as tq

PARTS = {"q_proj": 1024, "k_proj": 256, "v_proj": 256}


@pytest.mark.gpu
def test_block_fp8_rows_above_16_take_the_block_scaled_product(monkeypatch):
    monkeypatch.delenv("ENGINE_FP8_BLOCK_SCALED_MM", raising=False)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an SM90+ GPU")
    gen = torch.Generator().manual_seed(0)
    prefix = "model.layers.0.self_attn"
    dense = {f"{prefix}.{p}.weight": torch.randn(n, 1024, generator=gen) / 32
             for p, n in PARTS.items()}
    tensors, cfg, ref = tq.quantize_state(dense, "fp8_block", block=(128, 128))
    hook = importlib.import_module("engine_quant_fp8.impl").engine_create_quant_method
    method = hook(quant_config=cfg).for_layer(f"{prefix}.qkv_proj")
    with torch.device("cuda"):
        layer = tq.load_fused_layer(method, {n: t.cuda() for n, t in tensors.items()}, prefix,
                                    PARTS, 1024, torch.bfloat16)
    assert layer.block_scaled
    w = torch.cat([ref[n] for n in dense]).double()
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
