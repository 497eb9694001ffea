"""Programmatic dependent launch: off on CPUs, under the interpreter and with ENGINE_PDL=0 (the
kernels then compile without the grid-dependency instructions); on a Hopper GPU a chain of the
decode step's kernels captured in a CUDA graph gives bit-identical results with and without
it, replay after replay (a kernel reading before its predecessor finished would not)."""

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.runtime import triton_pdl  # noqa: E402


def test_off_on_a_cpu_and_under_the_interpreter(monkeypatch):
    assert triton_pdl.launch_options(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_pdl.pdl_enabled(torch.device("cuda", 0))


def test_engine_pdl_0_turns_it_off(monkeypatch):
    monkeypatch.setenv("ENGINE_PDL", "0")
    assert not triton_pdl.pdl_enabled(torch.device("cuda", 0))
    assert triton_pdl.launch_options(torch.device("cuda", 0)) == {"PDL": False}


def test_dense_rows_follow_the_launch_mode(monkeypatch):
    from engine.runtime import gemv_triton

    monkeypatch.setenv("ENGINE_PDL", "0")
    monkeypatch.delenv("ENGINE_GEMV_DENSE_ROWS", raising=False)
    assert gemv_triton.dense_rows(torch.device("cuda", 0)) == 0
    monkeypatch.setenv("ENGINE_GEMV_DENSE_ROWS", "3")
    assert gemv_triton.dense_rows(torch.device("cuda", 0)) == 3


def _chain(x, res, norm_w, w_qkv, w_down):
    """add + RMSNorm -> matrix-vector product -> SiLU-and-mul -> product, as a layer runs them."""
    from engine.runtime import fused_triton, gemv_triton

    h, r = fused_triton.add_rms_norm(x, res, norm_w, 1e-6)
    y = gemv_triton.gemv(h, w_qkv)
    a = fused_triton.silu_and_mul(y)
    return gemv_triton.gemv(a, w_down), r


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a CUDA device of compute capability 9 or more")
def test_graph_replays_equal_with_and_without_pdl(monkeypatch):
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, 4096, device=dev, generator=gen, dtype=torch.bfloat16)
    res = torch.randn(1, 4096, device=dev, generator=gen, dtype=torch.bfloat16)
    norm_w = torch.rand(4096, device=dev, generator=gen, dtype=torch.bfloat16)
    w_qkv = torch.randn(2 * 2816, 4096, device=dev, generator=gen, dtype=torch.bfloat16) / 64
    w_down = torch.randn(4096, 2816, device=dev, generator=gen, dtype=torch.bfloat16) / 64
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ENGINE_PDL", flag)
        assert triton_pdl.pdl_enabled(dev) == (flag == "1")
        _chain(x, res, norm_w, w_qkv, w_down)  # build the kernels outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, r = x, res
            for _ in range(8):  # each layer reads the one before
                y, r = _chain(y, r, norm_w, w_qkv, w_down)
        replays = []
        for _ in range(5):
            graph.replay()
            replays.append((y.clone(), r.clone()))
        torch.cuda.synchronize()
        for y_i, r_i in replays[1:]:
            assert torch.equal(y_i, replays[0][0]) and torch.equal(r_i, replays[0][1])
        outs[flag] = replays[0]
    assert torch.equal(outs["1"][0], outs["0"][0]) and torch.equal(outs["1"][1], outs["0"][1])
