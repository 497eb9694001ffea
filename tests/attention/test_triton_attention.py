"""triton attention plugin: the conformance kit and our own checks under Triton's interpreter
(child processes, since the interpreter must be chosen before triton is imported), the hook's
refusal without CUDA or the interpreter, options, and the full kit on CUDA when present (page 64: benchmarks/attention_gpu.py).

The interpreter is slow: by default the kit runs on a covering subset of its cases (page sizes
1 and 16, GQA 1, 3 and 4, head dims 64 and 128; page 16 with 16-key extend tiles, so whole tiles
come from one page through tensor descriptors), two child processes at a time;
``ENGINE_TRITON_FULL_KIT=1`` runs all twelve cases with the plugin's launch parameters, and
page 64 too, under 64-key tiles (descriptors) and under the interpreter's 128-key tiles (two
pages a tile) (a few minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config import ServerConfig
from engine.errors import ConfigError, PluginError
from engine.runtime.attention import KVPool

SCRIPT = Path(__file__).with_name("triton_interpret_checks.py")


def _spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _result(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_kit_and_own_checks_under_the_interpreter():
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreter run is the CPU check; test_kit_on_cuda runs the kernels")
    # page 16 under 16-key tiles: whole tiles inside one page, through tensor descriptors
    paged = ("kit", "16", "3", "64", "64,16,1")
    if os.environ.get("ENGINE_TRITON_FULL_KIT"):
        jobs = [("kit", "1", "1,3,4", "64,128"), ("kit", "16", "1,3,4", "64,128"), paged,
                ("kit", "64", "4", "128", "128,64,1"), ("kit", "64", "3", "64"), ("own",)]
    else:
        jobs = [("kit", "1", "1,4", "128"), paged, ("own",)]
    running = [_spawn(*j) for j in jobs[:2]]  # two at a time
    failures = []
    for job in jobs[2:]:
        failures += _result(running.pop(0))
        running.append(_spawn(*job))
    for proc in running:
        failures += _result(proc)
    assert failures == [], "\n".join(failures[:20])


def _cpu_pool() -> KVPool:
    return KVPool(num_layers=1, num_kv_heads=1, head_dim=64, num_slots=16, page_size=1,
                  dtype=torch.float32, device=torch.device("cpu"))


def test_decode_splits_stop_where_the_batch_alone_fills_the_gpu():
    from engine_attention_triton.impl import TritonBackend

    pool = KVPool(num_layers=1, num_kv_heads=8, head_dim=64, num_slots=64, page_size=1,
                  dtype=torch.float32, device=torch.device("cpu"))
    backend = TritonBackend(pool, 4)
    assert backend._max_splits(128) == 8  # no GPU: the option alone
    backend._programs = 4 * 132  # an H200: about four programs per multiprocessor
    # programs = batch x 8 KV heads x splits; splits stop once that reaches 528
    assert [backend._max_splits(n) for n in (1, 16, 32, 64, 128, 256)] == [8, 5, 3, 2, 1, 1]


def test_hook_refuses_a_cpu_pool_without_the_interpreter(monkeypatch):
    from engine_attention_triton.impl import engine_create_attention_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(PluginError, match=r"needs a CUDA GPU \(or TRITON_INTERPRET=1 on CPU\)"):
        engine_create_attention_backend(pool=_cpu_pool(), model_config=None, options={})


def test_options_reach_the_backend_and_are_validated():
    from engine.assembly import Assembly
    from engine_attention_triton.impl import backend_kwargs

    def kwargs(cfg: ServerConfig) -> dict:
        assembly = Assembly(cfg)
        return backend_kwargs(assembly.options(assembly.registry.find("triton", "attention")[0]))

    cfg = ServerConfig(plugin_options={"attention.triton": {
        "triton_attention_num_kv_splits": 4, "triton_attention_split_tile_size": 256,
        "triton_attention_reduce_in_fp32": True}})
    assert kwargs(cfg) == {"num_kv_splits": 4, "split_tile_size": 256, "reduce_in_fp32": True}
    assert kwargs(ServerConfig()) == {"num_kv_splits": 8, "split_tile_size": None,
                                      "reduce_in_fp32": False}
    bad = ServerConfig(plugin_options={"attention.triton": {"triton_attention_num_kv_splits": 0}})
    with pytest.raises(ConfigError, match="num-kv-splits"):
        kwargs(bad)


def test_the_default_launch_follows_the_page_size(monkeypatch):
    from engine_attention_triton.impl import (INTERPRETER_CONFIG, NEW_KV_LAUNCH, KernelConfig,
                                              default_config)

    monkeypatch.delenv("ENGINE_TRITON_NEW_KV", raising=False)
    monkeypatch.delenv("ENGINE_TRITON_DECODE_FUSED_MERGE", raising=False)
    monkeypatch.delenv("ENGINE_TRITON_Q_DESC", raising=False)
    for page in (64, 128):  # whole 64-key tiles in a page: descriptors, one head's tokens
        cfg = default_config(page, interpreted=False)
        assert (cfg.extend_tma, cfg.extend_block_n, cfg.extend_row_heads) == (True, 64, 1)
        assert not cfg.extend_new_kv
    for page in (1, 16, 32, 48):  # else this forward's K/V read as rows
        cfg = default_config(page, interpreted=False)
        assert cfg == KernelConfig(**NEW_KV_LAUNCH) and cfg.extend_new_kv
    assert default_config(64, interpreted=True) is INTERPRETER_CONFIG
    assert not INTERPRETER_CONFIG.extend_new_kv
    assert KernelConfig().extend_index_asm and not KernelConfig().decode_fused_merge
    assert not KernelConfig().extend_new_kv and KernelConfig().extend_q_desc
    monkeypatch.setenv("ENGINE_TRITON_NEW_KV", "0")  # the environment is read per backend
    assert default_config(16, interpreted=False) == KernelConfig()
    monkeypatch.setenv("ENGINE_TRITON_DECODE_FUSED_MERGE", "1")
    monkeypatch.setenv("ENGINE_TRITON_NEW_KV", "1")
    monkeypatch.setenv("ENGINE_TRITON_Q_DESC", "0")
    cfg = default_config(64, interpreted=False)
    assert cfg.decode_fused_merge and cfg.extend_new_kv and cfg.extend_block_n == 64
    assert not cfg.extend_q_desc and not default_config(16, interpreted=False).extend_q_desc


def test_manifest_states_its_needs_and_seed_flags():
    from engine_attention_triton import plugin

    assert plugin.requires.devices == ("cuda",) and "triton" in plugin.requires.packages
    assert plugin.priority > 10  # above torch_native where it can run
    assert {o.flag for o in plugin.options} == {
        "--triton-attention-num-kv-splits", "--triton-attention-split-tile-size",
        "--triton-attention-reduce-in-fp32"}


@pytest.mark.gpu
def test_kit_on_cuda():
    from engine.testing import attention as kit

    failures = kit.check("triton", kit.plugin_backend("triton"), device="cuda")
    assert failures == [], "\n".join(failures[:20])
