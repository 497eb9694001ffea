"""``--kv-cache-dtype``: fp8 storage with per-layer scales, dequantized on read by torch_native
and in the triton kernels; formats this build cannot store are refused with the reason
(fp4_mx_block16: test_kv_fp4.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.testing import quant as tq

IDS = [[5, 17, 300, 41, 8, 99, 250, 7, 3, 11, 12, 13]]


def run(path, kv, backend="torch_native", swap=None, device="cpu", dtype="float32", **options):
    """Logits of a prefill and a decode step; ``swap(runner)`` may replace the runner's
    attention backends first (a backend the CLI does not offer on a CPU)."""
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    runner = ModelRunner(ServerConfig(model_path=path, device=device, dtype=dtype,
                                      skip_tokenizer_init=True, max_total_tokens=128,
                                      attention_backend=backend, kv_cache_dtype=kv,
                                      **options))
    if swap is not None:
        swap(runner)
    b = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    row = b.new_request()
    first = runner.forward(b.extend([(row, IDS[0])], all_logits=True))
    return torch.cat([first, runner.forward(b.decode([(row, 4)]))]), runner


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("m"))
    tq.tiny_llama(path)
    return path


@pytest.mark.parametrize("kv,fmt", [("fp8_e4m3", torch.float8_e4m3fn),
                                    ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_kv_cache_is_stored_fp8_and_close_to_float32(model, kv, fmt):
    base, _ = run(model, "auto")
    got, runner = run(model, kv)
    assert runner.pool.k[0].dtype == fmt
    p, q = F.log_softmax(base, -1), F.log_softmax(got, -1)
    assert (p.exp() * (p - q)).sum(-1).mean() < 0.02
    assert (got.argmax(-1) == base.argmax(-1)).float().mean() >= 0.75


def test_checkpoint_kv_scales_are_used(model, tmp_path):
    dst = str(tmp_path / "s")
    os.makedirs(dst)
    state = load_file(os.path.join(model, "model.safetensors"))
    state["model.layers.1.self_attn.k_scale"] = torch.tensor(0.5)
    state["model.layers.1.self_attn.v_proj.v_scale"] = torch.tensor(0.25)  # modelopt-style
    save_file(state, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(model, "config.json")) as fh, \
            open(os.path.join(dst, "config.json"), "w") as out:
        json.dump(json.load(fh), out)
    _, runner = run(dst, "fp8_e4m3")
    assert runner.pool.k_scale == [1.0, 0.5] and runner.pool.v_scale == [1.0, 0.25]
    _, dense = run(dst, "auto")  # scales ignored when the cache is not fp8
    assert dense.pool.k_scale == [1.0, 1.0]


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_cpu_decode_reads_the_fp8_pool_in_the_c_kernel_as_the_gather_does(model, kv,
                                                                          monkeypatch):
    """On the CPU an fp8 pool's decode steps go through the core's pool kernel (fp8 widened as
    it is read, the layer's scales applied; prefills keep the gathered SDPA): the logits equal
    the gathered path's to float32 rounding, with checkpoint-like scales."""
    import engine_attention_torch_native.impl as tn

    from engine.runtime import fused_cpu

    calls = []
    real = fused_cpu.decode_attention
    monkeypatch.setattr(fused_cpu, "decode_attention",
                        lambda *a, **k: calls.append(a[1].dtype) or real(*a, **k))

    def scaled(runner):
        runner.pool.k_scale[:] = [0.5, 0.25]
        runner.pool.v_scale[:] = [0.125, 2.0]

    got, _ = run(model, kv, swap=scaled)
    assert calls and set(calls) == {getattr(torch, {"fp8_e4m3": "float8_e4m3fn",
                                                    "fp8_e5m2": "float8_e5m2"}[kv])}
    monkeypatch.setattr(tn, "pool_attention_applies", lambda pool: False)
    want, _ = run(model, kv, swap=scaled)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def _with_tensors(model, dst, extra):
    """A copy of the tiny model at ``dst`` with ``extra`` checkpoint tensors."""
    os.makedirs(dst)
    state = load_file(os.path.join(model, "model.safetensors"))
    save_file({**state, **extra}, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(model, "config.json")) as fh, \
            open(os.path.join(dst, "config.json"), "w") as out:
        json.dump(json.load(fh), out)
    return dst


def test_a_legacy_kv_scale_serves_both_and_a_lone_scale_is_shared(model, tmp_path):
    dst = _with_tensors(model, str(tmp_path / "s"), {
        "model.layers.0.self_attn.kv_scale": torch.tensor(0.5),  # legacy: k and v
        "model.layers.1.self_attn.v_scale": torch.tensor(0.25)})  # v only: k takes it too
    _, runner = run(dst, "fp8_e4m3")
    assert runner.pool.k_scale == [0.5, 0.25] and runner.pool.v_scale == [0.5, 0.25]


def _scale_file(tmp_path, layers, dtype="float8_e4m3fn", **top):
    path = tmp_path / "kv_scales.json"
    path.write_text(json.dumps({**top, "kv_cache": {"dtype": dtype,
                                                     "scaling_factor": {"0": layers}}}))
    return str(path)


def test_quantization_param_path_scales_override_the_checkpoints(model, tmp_path):
    dst = _with_tensors(model, str(tmp_path / "s"),
                        {"model.layers.1.self_attn.k_scale": torch.tensor(0.5)})
    path = _scale_file(tmp_path, {"0": 0.02, "1": 0.03}, model_type="llama")
    base, _ = run(dst, "auto")
    got, runner = run(dst, "fp8_e4m3", quantization_param_path=path)
    assert runner.pool.k_scale == [0.02, 0.03] and runner.pool.v_scale == [0.02, 0.03]
    p, q = F.log_softmax(base, -1), F.log_softmax(got, -1)
    assert (p.exp() * (p - q)).sum(-1).mean() < 0.05  # k, v stored as x / 0.02: still close
    # stored as k / scale: a scale 100x too small overflows fp8's range and the logits move
    far, _ = run(dst, "fp8_e4m3", quantization_param_path=_scale_file(
        tmp_path, {"0": 2e-4, "1": 3e-4}))
    assert (far - got).abs().max() > (got - base).abs().max()
    # a cache that is not fp8 leaves the file unused
    _, dense = run(dst, "auto", quantization_param_path=path)
    assert dense.pool.k_scale == [1.0, 1.0]


@pytest.mark.parametrize("content,pattern", [
    (None, "cannot read it"),
    ("{", "not JSON"),
    ({"kv": {}}, 'needs an object with a "kv_cache" object'),
    ({"model_type": "qwen2", "kv_cache": {"dtype": "float8_e4m3fn",
                                          "scaling_factor": {"0": {"0": 1, "1": 1}}}},
     "model_type is 'qwen2', the model is 'llama'"),
    ({"kv_cache": {"dtype": "float8_e5m2", "scaling_factor": {"0": {"0": 1, "1": 1}}}},
     "kv_cache.dtype is 'float8_e5m2'; --kv-cache-dtype fp8_e4m3 needs 'float8_e4m3fn'"),
    ({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1, "1": 1},
                                                                "1": {"0": 1, "1": 1}}}},
     r"has ranks \['0', '1'\]; this server runs one rank"),
    ({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1}}}},
     "kv_cache.scaling_factor.0 has no scale for layers 1 "),
    ({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1, "1": -2}}}},
     "kv_cache.scaling_factor.0.1 is -2, not a positive number"),
    ({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1, "7": 1}}}},
     "kv_cache.scaling_factor.0.7: the model has layers 0-1"),
])
def test_a_bad_quantization_param_file_is_refused_naming_the_field(model, tmp_path, content,
                                                                  pattern):
    path = tmp_path / "kv_scales.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match="--quantization-param-path .*" + pattern):
        run(model, "fp8_e4m3", quantization_param_path=str(path))


def test_scale_file_names_missing_layers_as_ranges(tmp_path):
    from engine.runtime.kv_scales import scale_file

    path = _scale_file(tmp_path, {str(i): 1.0 for i in (0, 1, 2, 5, 9)})
    with pytest.raises(ConfigError, match="no scale for layers 3-4, 6-8, 10-11 "):
        scale_file(path, 12, "fp8_e4m3")
    assert scale_file(_scale_file(tmp_path, {"0": 0.5, "1": 2}, dtype="float8_e5m2"), 2,
                      "fp8_e5m2") == [0.5, 2.0]


@pytest.mark.parametrize("kv,pattern", [("nvfp4", "SM100"), ("mxfp8", "SM100")])
def test_unsupported_kv_dtypes_are_refused(model, kv, pattern):
    with pytest.raises(ConfigError, match=pattern):
        run(model, kv)


TRITON_FP8 = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[2])
import torch
from engine_attention_triton.impl import TritonBackend
from test_kv_cache_dtype import run

def triton(runner):
    cfg = runner.model_config
    backend = TritonBackend(runner.pool, cfg.num_attention_heads // cfg.num_key_value_heads)
    runner.prefill_backend = runner.decode_backend = backend

for kv in ("fp8_e4m3", "fp8_e5m2"):
    got, runner = run(sys.argv[1], kv, swap=triton)
    want, _ = run(sys.argv[1], kv)
    assert runner.pool.is_fp8 and type(runner.decode_backend).__name__ == "TritonBackend"
    err = (got - want).abs().max().item()
    assert err < 1e-3, (kv, err)
print("ok")
"""


def test_triton_reads_the_fp8_cache_as_torch_native_does(model):
    """The triton backend widens the fp8 pool in its kernels and applies the layer scales:
    its logits equal torch_native's, which dequantizes through ``KVPool.gather`` (under the
    Triton interpreter here)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", TRITON_FP8, model, os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_triton_reads_the_fp8_cache_on_the_gpu(model, kv):
    """On a GPU (SM89+) the triton backend is offered with an fp8 cache, and its logits equal
    torch_native's over the same stored values."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("Triton's fp8 types need SM89+")
    got, runner = run(model, kv, backend="triton", device="cuda")
    want, _ = run(model, kv, device="cuda")
    assert type(runner.decode_backend).__name__ == "TritonBackend" and runner.pool.is_fp8
    assert (got - want).abs().max().item() < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("page", [1, 16])
def test_flashinfer_reads_the_fp8_cache_on_the_gpu(model, tmp_path, kv, graphs, page):
    """flashinfer plans an fp8 pool (bf16 queries, fp8 KV, its FA2 kernels) and passes each
    layer's k/v scales to ``run``: prefill and decode logits (eager, and replayed from a CUDA
    graph) match torch_native's over the same stored values; the scales are not 1, so a
    scale left out would show."""
    pytest.importorskip("flashinfer")
    dst = str(tmp_path / "s")
    os.makedirs(dst)
    state = load_file(os.path.join(model, "model.safetensors"))
    for i, (k, v) in enumerate(((0.5, 0.25), (2.0, 4.0))):
        state[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k)
        state[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v)
    save_file(state, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(model, "config.json")) as fh, \
            open(os.path.join(dst, "config.json"), "w") as out:
        json.dump(json.load(fh), out)
    opts = dict(device="cuda", dtype="bfloat16", page_size=page, disable_cuda_graph=not graphs)
    got, runner = run(dst, kv, backend="flashinfer", **opts)
    want, ref = run(dst, kv, **opts)
    assert type(runner.decode_backend).__name__ == "FlashInferBackend" and runner.pool.is_fp8
    assert runner.pool.k_scale == ref.pool.k_scale == [0.5, 2.0]
    got, want = got.float(), want.float()
    assert (got - want).abs().max().item() <= 0.02 * want.abs().max().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
