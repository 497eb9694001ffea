"""The packed-weight products (GPTQ/AWQ/compressed-tensors/MLX/auto-round codes, fp8 and int8
W8A8, block fp8) equal their formats' float references, kernel by kernel and through each
plugin's layer: under the Triton interpreter here, on the GPU where there is one."""

import os

import pytest
import torch

from child_checks import run_checks

CHECKS = os.path.join(os.path.dirname(__file__), "quant_kernel_checks.py")


def run(device: str, env: dict) -> list:
    return run_checks(CHECKS, device, env=env)


def test_quant_kernels_under_the_interpreter():
    assert run("cpu", {"TRITON_INTERPRET": "1"}) == []


@pytest.mark.gpu
def test_quant_kernels_on_the_gpu():
    assert run("cuda", {}) == []


def test_cpu_layers_stay_dense(monkeypatch):
    """Without a GPU (or the interpreter) a weight-only layer is served by its dense copy."""
    from engine.runtime.quant_methods import packed_kernels
    from engine.runtime.linear import Linear
    from engine.runtime.quant_schemes import AWQMethod

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    layer = Linear(64, 64, dtype=torch.bfloat16, quant_method=AWQMethod(32).bind("x"))
    assert not packed_kernels(layer)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert packed_kernels(layer)
    monkeypatch.setenv("ENGINE_DISABLE_QUANT_KERNELS", "1")
    assert not packed_kernels(layer)


def test_act_order_permutation():
    from engine.runtime.quant_methods import act_order

    g = torch.tensor([1, 0, 1, 0, 2, 2])
    ok, perm = act_order(g, 2)
    assert ok and g[perm].tolist() == [0, 0, 1, 1, 2, 2]
    assert act_order(torch.arange(6) // 2, 2) == (True, None)
    assert act_order(torch.tensor([0, 0, 0, 1, 2, 2]), 2)[0] is False
