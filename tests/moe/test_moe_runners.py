"""The MoE runner and all-to-all families: the conformance kit on the torch runner, the Triton
fused-MoE kernels under the Triton interpreter (kit + a whole tiny model against the torch
runner), honest refusals, and expert parallelism over two gloo processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from engine.errors import ConfigError, PluginError
from engine.plugins.registry import Registry
from engine.testing.moe import cases, runner_failures

from child_checks import run_checks

HERE = os.path.dirname(__file__)
ROOT = os.path.join(HERE, "..", "..")


def test_torch_runner_passes_the_kit_in_float32_and_bfloat16():
    from engine_moe_torch.impl import TorchRunner

    assert list(runner_failures(TorchRunner(), torch.device("cpu"))) == []
    assert any(c.tokens >= 2048 for c in cases())


def test_triton_kernels_under_the_interpreter():
    """Kit cases (float32) and a tiny Qwen3-MoE model whose logits equal the torch runner's."""
    assert run_checks(os.path.join(HERE, "triton_interpret_checks.py"),
                      env={"TRITON_INTERPRET": "1"}) == []


def test_one_token_down_launch_with_its_combine_under_the_interpreter():
    """``kernels.token_moe`` against the pair launches + combine and float32 (residual, a -1
    pair), the runner routing one token to it, and its switch's parsing."""
    assert run_checks(os.path.join(HERE, "token_moe_checks.py"), "cpu",
                      env={"TRITON_INTERPRET": "1"}) == []


@pytest.mark.parametrize("tokens,token_down", [(1, None), (2, None), (1, (4, 16, 4))])
def test_triton_runner_hands_each_kernel_only_its_own_launch_options(monkeypatch, tokens,
                                                                    token_down):
    """Off the interpreter the runner passes its launch table itself (the interpreter swaps in
    small tiles): every key it hands ``pair_moe`` / ``token_moe`` must be one of theirs."""
    import inspect

    from engine.api.moe import ExpertWeights
    from engine_moe_triton import impl, kernels

    accepted = {name: set(inspect.signature(getattr(kernels, name)).parameters)
                for name in ("pair_moe", "token_moe")}
    calls = {}

    def recorder(name):
        def record(*args, **kwargs):
            calls[name] = kwargs
        return record

    monkeypatch.setattr(impl, "interpreting", lambda: False)
    for name in ("pair_moe", "token_moe"):
        monkeypatch.setattr(kernels, name, recorder(name))
    monkeypatch.setattr(kernels, "combine_pairs", lambda down, k, dtype, residual=None: down)
    runner = impl.TritonRunner(None)
    runner.gemv_one = dict(runner.gemv_one, token_down=token_down)
    experts = ExpertWeights(4, 64, 32, torch.float32)
    ids = torch.zeros(tokens, 2, dtype=torch.int32)
    runner.apply(experts, torch.zeros(tokens, 64), ids, torch.ones(tokens, 2))
    (name, kwargs), = calls.items()
    assert name == ("token_moe" if token_down else "pair_moe")
    assert set(kwargs) <= accepted[name], set(kwargs) - accepted[name]


@pytest.mark.gpu
def test_one_token_down_launch_with_its_combine_on_the_gpu():
    assert run_checks(os.path.join(HERE, "token_moe_checks.py"), "cuda") == []


def test_triton_hook_refuses_a_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from engine_moe_triton.impl import engine_create_moe_runner

    with pytest.raises(PluginError, match=r"needs a CUDA GPU \(or TRITON_INTERPRET=1"):
        engine_create_moe_runner(model_config=None, config=None, device="cpu", options={})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_serve_refuses_triton_runner_without_cuda_with_the_reason():
    from engine.cli.args import parse_config

    with pytest.raises(ConfigError, match=r"--moe-runner-backend triton .* unavailable: needs a CUDA GPU"):
        parse_config(["--moe-runner-backend", "triton"], Registry())


def test_every_runner_and_a2a_choice_is_packaged():
    reg = Registry()
    runners = {r.name for r in reg.family_records("moe")}
    a2a = {r.name for r in reg.family_records("moe_a2a")}
    want_runners = {"triton", "triton_kernel", "deep_gemm", "flashinfer_trtllm",
                    "experimental_sgl_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutlass",
                    "flashinfer_mxfp4", "flashinfer_cutedsl", "flashinfer_megamoe", "cutlass",
                    "aiter", "marlin", "humming", "experimental_sgl_marlin", "hpc_ops",
                    "megamoe", "intel_xpu", "torch"}
    want_a2a = {"none", "deepep", "deepep_v2", "mooncake", "nixl", "mori", "flashinfer", "pplx",
                "megamoe", "flashinfer_megamoe", "ascend_fuseep", "ascend_tp"}
    if not (want_runners <= runners and want_a2a <= a2a):
        pytest.skip("not every MoE plugin is installed here (a partial GPU set-up)")
    for rec in reg.family_records("moe") + reg.family_records("moe_a2a"):
        if rec.name not in ("torch", "none", "triton"):
            assert rec.status != "available" and rec.reason, rec.name


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_expert_parallel_over_two_gloo_processes_matches_one_process():
    port = _free_port()
    worker = os.path.join(HERE, "ep_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, str(r), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    assert sorted(o.split()[-1] for o, _ in outs) == ["0", "1"]
