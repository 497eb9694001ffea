"""The sampling kernel (greedy rows, temperature, top-k, top-p, min-p, Philox draws keyed by
seed and position) and the sampler's use of it, under the Triton interpreter here and on the
GPU where there is one (tests/runtime/sample_checks.py holds the checks)."""

import os

import pytest

from child_checks import run_checks

pytest.importorskip("triton")

CHECKS = os.path.join(os.path.dirname(__file__), "sample_checks.py")


def run(device: str, draws: int, env: dict) -> list:
    return run_checks(CHECKS, device, draws, env=env)


def test_sampling_kernel_under_the_interpreter():
    assert run("cpu", 80, {"TRITON_INTERPRET": "1"}) == []


@pytest.mark.gpu
def test_sampling_kernel_on_the_gpu():
    assert run("cuda", 4000, {}) == []
