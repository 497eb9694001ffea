"""Triton kernel builds after ready are counted and logged (engine.runtime.kernel_builds)."""

import logging

import pytest
import torch

from engine.runtime.kernel_builds import KernelBuilds

knobs = pytest.importorskip("triton.knobs")


@pytest.fixture
def builds():
    saved = knobs.runtime.jit_cache_hook
    seen = []

    def previous(**kw):  # a hook someone set before: still called, its answer kept
        seen.append(kw["repr"])
        return False
    knobs.runtime.jit_cache_hook = previous
    b = KernelBuilds()
    assert b.install() and b.installed and b.install()
    yield b, seen
    knobs.runtime.jit_cache_hook = saved


def test_builds_before_and_after_ready(builds, caplog):
    b, seen = builds
    hook = knobs.runtime.jit_cache_hook
    assert hook(key="k1", repr="_kernel_a[num_warps=4](x: *fp32)") is False
    assert (b.total, b.after_ready) == (1, 0)
    assert b.mark_ready() == 1
    with caplog.at_level(logging.WARNING, logger="engine.runtime"):
        assert hook(key="k2", repr="_kernel_b[num_warps=8](x: *bf16)") is False
    assert (b.total, b.after_ready) == (2, 1)
    assert list(b.late) == ["_kernel_b[num_warps=8](x: *bf16)"]
    assert "built after ready" in caplog.text and "_kernel_b" in caplog.text
    assert seen == ["_kernel_a[num_warps=4](x: *fp32)", "_kernel_b[num_warps=8](x: *bf16)"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_real_build_after_ready_is_counted(builds):
    import triton
    import triton.language as tl

    @triton.jit
    def _twice(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2)

    b, _ = builds
    x = torch.ones(16, device="cuda")
    _twice[(1,)](x, BLOCK=16)
    b.mark_ready()
    _twice[(1,)](x, BLOCK=16)  # the same variant: no build
    assert b.after_ready == 0
    _twice[(1,)](x, BLOCK=8)  # a new constexpr: a build
    assert b.after_ready == 1 and "_twice" in b.late[0]
