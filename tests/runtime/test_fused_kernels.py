"""The fused decoder kernels (residual add + RMSNorm, per-head q/k norm + RoPE, SiLU-and-mul)
equal the torch ops they replace in half precision: under the Triton interpreter here, on the
GPU where there is one."""

import json
import os
import subprocess
import sys

import pytest
import torch

CHECKS = os.path.join(os.path.dirname(__file__), "fused_checks.py")


def run(device: str, env: dict) -> list:
    proc = subprocess.run([sys.executable, CHECKS, device], capture_output=True, text=True,
                          timeout=900, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fused_kernels_under_the_interpreter():
    assert run("cpu", {"TRITON_INTERPRET": "1"}) == []


@pytest.mark.gpu
def test_fused_kernels_on_the_gpu():
    assert run("cuda", {}) == []


def test_float32_and_cpu_tensors_keep_the_torch_ops(monkeypatch):
    from engine.runtime import fused

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not fused.enabled(torch.zeros(2, 2))
    assert not fused.enabled(torch.zeros(2, 2, dtype=torch.bfloat16))
