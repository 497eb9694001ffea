"""Quantized checkpoints of every real format: a tiny 2-layer model at the default model's
widths, written by :mod:`engine.testing.quant`, gives the logits of the same model with the
format's dequantized weights (float32), exactly for weight-only formats; activation-quantized
layers equal their own quantize-dequantize reference; detection, conflicts and bad checkpoints
are one-line errors."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.runtime import quant_formats as qf
from engine.testing import quant as tq

IDS = [[5, 17, 300, 41, 8, 99, 250, 7], [3, 11]]


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dense"))
    return path, tq.tiny_llama(path)


def logits(path: str, quantization: str | None = None, dtype: str = "float32") -> torch.Tensor:
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    runner = ModelRunner(ServerConfig(model_path=path, device="cpu", dtype=dtype,
                                      skip_tokenizer_init=True, max_total_tokens=256,
                                      attention_backend="torch_native", max_running_requests=2,
                                      quantization=quantization))
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    rows = [builder.new_request() for _ in IDS]
    first = runner.forward(builder.extend(list(zip(rows, IDS))))
    nxt = runner.forward(builder.decode([(r, 1) for r in rows]))
    return torch.cat([first, nxt]), runner


def reference_dir(tmp: str, dense_state: dict, ref: dict) -> str:
    from safetensors.torch import save_file

    path = os.path.join(tmp, "ref")
    os.makedirs(path, exist_ok=True)
    src = dense_state["__path__"]
    with open(os.path.join(src, "config.json")) as fh:
        cfg = json.load(fh)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    state = {k: v for k, v in dense_state.items() if k != "__path__"}
    state.update(ref)
    save_file(state, os.path.join(path, "model.safetensors"))
    return path


WEIGHT_ONLY = [("gptq", {}), ("gptq", {"desc_act": True, "group": 32}), ("gptq", {"bits": 8}),
               ("gptq", {"bits": 2, "group": 32}),
               ("auto_round", {}), ("awq", {"sym": False}), ("awq", {"group": 32}),
               ("ct_wna16", {}), ("ct_wna16", {"sym": False, "group": 32}),
               ("ct_wna16", {"sym": False, "bits": 8}),
               ("ct_w8a16", {}), ("mlx4", {}), ("mlx8", {"group": 32}), ("modelopt_nvfp4", {}),
               ("bnb_nf4", {})]


@pytest.mark.parametrize("scheme,kw", WEIGHT_ONLY, ids=[f"{s}-{k}" for s, k in WEIGHT_ONLY])
def test_weight_only_logits_equal_the_dequantized_float32_model(dense, tmp_path, scheme, kw):
    path, state = dense
    ref = tq.write_checkpoint(path, str(tmp_path / "q"), scheme, **kw)
    ours, runner = logits(str(tmp_path / "q"))
    want, _ = logits(reference_dir(str(tmp_path), {**state, "__path__": path}, ref))
    assert runner.model.quant_method is not None
    # the same float32 weights (4-bit codes multiplied packed for a few rows, the rest through
    # the dense product): equal up to the order of additions, a few units in the last place of
    # the largest logit
    tol = 1e-6 * want.abs().max().item()
    assert torch.allclose(ours, want, atol=tol, rtol=0), (ours - want).abs().max()


@pytest.mark.parametrize("choice", [None, "auto-round"])
def test_detected_and_named_method_agree(dense, tmp_path, choice):
    path, _ = dense
    tq.write_checkpoint(path, str(tmp_path / "q"), "auto_round")
    a, runner = logits(str(tmp_path / "q"), choice)
    assert type(runner.model.model.layers[0].mlp.down_proj.quant_method).__name__ == "GPTQMethod"


ACT = ["ct_w8a8_int8", "ct_fp8_dynamic", "ct_fp8_static", "ct_fp8_block", "fp8_block",
       "fp8_tensor", "modelopt_fp8", "quark_fp8", "mxfp8", "modelopt_mxfp8", "quark_mxfp4",
       "bnb_int8"]


def _fake_fp8(x, scale):
    return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale


def _llm_int8_activations(x: torch.Tensor, threshold: float = 6.0) -> torch.Tensor:
    """The activation values LLM.int8 multiplies: per row, the float16 values of the columns
    without an outlier rounded to 127 levels of the row's absmax (outliers left out of it);
    the columns with an outlier (in any row) as they are."""
    a16 = x.half()
    big = a16.abs() >= threshold
    cols = big.any(0)
    kept = torch.where(big, torch.zeros_like(a16), a16)
    rs = kept.abs().amax(1, keepdim=True).float()
    q = torch.round(kept.float() * (127.0 / rs))
    if x.shape[0] > 1:
        q[:, cols] = 0
    return torch.where(cols, x, q * rs / 127)


def _reference_linear(scheme: str, x: torch.Tensor, w: torch.Tensor, tensors: dict,
                      base: str, block=(128, 128)) -> torch.Tensor:
    """The format's arithmetic written out: quantize the activations as its kernels do, then
    a float64 product with the dequantized weight."""
    if scheme == "ct_w8a8_int8":
        s = x.abs().amax(-1, keepdim=True) / 127
        xq = torch.round(x / s).clamp(-128, 127) * s
    elif scheme in ("ct_fp8_dynamic",):
        s = x.abs().amax(-1, keepdim=True) / 448
        xq = _fake_fp8(x, s)
    elif scheme in ("ct_fp8_block", "fp8_block"):
        g = block[1]
        xg = F.pad(x, (0, (-x.shape[1]) % g)).reshape(x.shape[0], -1, g)
        s = xg.abs().amax(-1, keepdim=True) / 448
        xq = _fake_fp8(xg, s).reshape(x.shape[0], -1)[:, :x.shape[1]]
    elif scheme in ("mxfp8", "modelopt_mxfp8"):  # power-of-two scales per token and 32
        xg = x.reshape(x.shape[0], -1, 32)
        s = torch.pow(2.0, torch.ceil(torch.log2(xg.abs().amax(-1, keepdim=True) / 448)))
        xq = _fake_fp8(xg, s).reshape(x.shape)
    elif scheme == "bnb_int8":  # LLM.int8: int8 rows, outlier columns in full precision
        xq = _llm_int8_activations(x)
    elif scheme == "quark_mxfp4":  # OCP scales per token and 32, nearest E2M1, ties to even
        xg = x.reshape(x.shape[0], -1, 32)
        s = torch.pow(2.0, torch.floor(torch.log2(xg.abs().amax(-1, keepdim=True))) - 2)
        vals = torch.tensor(qf.E2M1_VALUES[:8])
        a = (xg / s).abs().clamp(max=6.0)
        idx = ((a[..., None] - vals).abs() + 1e-7 * (torch.arange(8) % 2)).argmin(-1)
        xq = (vals[idx] * torch.sign(xg) * s).reshape(x.shape)
    else:  # static per-tensor
        xq = _fake_fp8(x, tensors[base + ".input_scale"].float())
    return (xq.double() @ w.double().T).float()


@pytest.mark.parametrize("scheme", ACT)
def test_activation_quantized_layers_equal_their_reference(scheme):
    from engine.assembly import Assembly
    from engine.runtime.linear import Linear

    torch.manual_seed(0)
    block = (64, 64)
    sizes = (192, 64, 64)
    w = {f"m.{p}.weight": torch.randn(n, 576) * 0.05 for p, n in zip(("q_proj", "k_proj",
                                                                       "v_proj"), sizes)}
    tensors, qcfg, ref = tq.quantize_state(
        {f"model.layers.0.self_attn.{k[2:]}": v for k, v in w.items()}, scheme, block=block)
    del Assembly
    from engine.plugins.registry import Registry
    registry = Registry()
    record = registry.resolve("quantization", tq.CHOICE[scheme], flag="--quantization")
    impl = __import__(record.manifest.implementation, fromlist=["x"])
    method = impl.engine_create_quant_method(quant_config={**qcfg, "quant_method": qcfg.get(
        "quant_method", "")}).for_layer("model.layers.0.self_attn.qkv_proj")
    layer = Linear(576, sum(sizes), quant_method=method, shards=sizes)
    start = 0
    params = dict(layer.named_parameters())
    for p, n in zip(("q_proj", "k_proj", "v_proj"), sizes):
        base = f"model.layers.0.self_attn.{p}"
        for key, t in tensors.items():
            if key.startswith(base + "."):
                leaf = key[len(base) + 1:]
                params[leaf].weight_loader(params[leaf], t, start, n)
        start += n
    layer.process_weights_after_loading()
    x = torch.randn(5, 576)
    got = layer(x)
    outs, start = [], 0
    for p, n in zip(("q_proj", "k_proj", "v_proj"), sizes):
        base = f"model.layers.0.self_attn.{p}"
        if scheme in ("ct_fp8_static", "fp8_tensor", "modelopt_fp8", "quark_fp8"):
            # a fused layer quantizes its shared input with the largest shard scale
            top = max(float(tensors[f"model.layers.0.self_attn.{q}.input_scale"].float())
                      for q in ("q_proj", "k_proj", "v_proj"))
            tensors = {**tensors, base + ".input_scale": torch.tensor(top)}
        outs.append(_reference_linear(scheme, x, ref[base + ".weight"], tensors, base, block))
    want = torch.cat(outs, 1)
    # float32 against float64 sums of the same quantized operands
    tol = 1e-5 * (x.abs() @ torch.cat([ref[k] for k in sorted(ref)]).abs().T).max()
    assert (got - want).abs().max() <= max(tol, 2e-5), (got - want).abs().max()


def test_llm_int8_takes_outlier_columns_out_and_equals_bitsandbytes():
    from engine.api.quant import PerLayer

    parts, gen = tq.QKV_PARTS, torch.Generator().manual_seed(3)
    dense = tq.qkv_weights(gen)
    tensors, qcfg, ref = tq.quantize_state(dense, "bnb_int8")
    from engine_quant_bitsandbytes.impl import engine_create_quant_method

    method = engine_create_quant_method(quant_config=qcfg)
    assert isinstance(method, PerLayer)
    layer = tq.load_fused_layer(method.for_layer("model.layers.0.self_attn.qkv_proj"), tensors,
                                "model.layers.0.self_attn", parts, 576)
    x = torch.randn(6, 576, generator=gen)
    x[:, 7] *= 10  # outlier columns: one everywhere, one in a single row
    x[2, 100] = -7.5
    w = torch.cat([ref[k] for k in dense])
    tol = 1e-5 * (x.abs() @ w.abs().T).max()  # float32 sums against float64 ones
    got = layer(x)
    want = (_llm_int8_activations(x).double() @ w.double().T).float()
    assert (got - want).abs().max() <= tol, (got - want).abs().max()
    one = layer(x[2:3])  # a single row: its own outlier columns, its own statistics
    want = (_llm_int8_activations(x[2:3]).double() @ w.double().T).float()
    assert (one - want).abs().max() <= tol
    try:  # the library's own operators, where it is installed (not a dependency)
        import bitsandbytes as bnb
    except Exception:  # noqa: BLE001 - absent, or no backend for this machine
        return
    cb = torch.cat([tensors[f"model.layers.0.self_attn.{p}.weight"] for p in parts])
    scb = torch.cat([tensors[f"model.layers.0.self_attn.{p}.SCB"] for p in parts])
    state = bnb.MatmulLtState()
    state.CB, state.SCB, state.threshold, state.has_fp16_weights = cb, scb, 6.0, False
    state.is_training = False  # inference: MatMul8bitLt (int8 rows, outlier columns)
    lib = bnb.matmul(x, cb, state=state, threshold=6.0)
    assert torch.equal(got, lib.to(got.dtype)), (got - lib).abs().max()


def test_int8_layers_are_batch_invariant(dense, tmp_path):
    path, _ = dense
    tq.write_checkpoint(path, str(tmp_path / "q"), "ct_w8a8_int8")
    _, runner = logits(str(tmp_path / "q"))
    layer = runner.model.model.layers[0].mlp.gate_up_proj
    x = torch.randn(9, 576)
    one = torch.cat([layer(x[i:i + 1]) for i in range(9)])
    assert torch.equal(layer(x), one)


def test_online_fp8_and_w8a8_fp8_run_on_a_dense_checkpoint(dense):
    path, _ = dense
    base, _ = logits(path)
    for choice in ("fp8", "w8a8_fp8", "mxfp8", "quark_mxfp4", "mxfp_w4a8"):
        got, runner = logits(path, choice)
        assert runner.model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
        p, q = F.log_softmax(base, -1), F.log_softmax(got, -1)
        kl = (p.exp() * (p - q)).sum(-1).mean()
        assert kl < 0.05, kl


def test_mx_scales_are_the_power_of_two_just_above_the_block_maximum():
    amax = torch.tensor([448.0, 449.0, 224.0, 1.0, 0.0])
    e = qf.mx_exponents(amax, 448.0)
    assert e.tolist() == [127, 128, 126, 119, 0]  # 1 -> 2^-8 (448 * 2^-9 < 1 <= 448 * 2^-8)
    assert torch.isnan(qf.e8m0_to_float(torch.tensor([255], dtype=torch.uint8))).all()
    x = torch.randn(3, 64) * torch.logspace(-3, 3, 64)  # blocks of very different ranges
    q, e = qf.quantize_mxfp8(x)
    got = qf.dequant_mxfp8(q, e)
    assert q.dtype == torch.float8_e4m3fn and e.shape == (3, 2)
    block_max = x.abs().reshape(3, 2, 32).amax(-1).repeat_interleave(32, 1)
    assert q.float().abs().amax() <= 448  # rounded-up scales: nothing saturates
    assert torch.all((got - x).abs() <= block_max / 16)  # within e4m3's step at the block's top
    # E2M1 (MXFP4): midpoints go to the even code, beyond 6 saturates, -0 is +0
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -0.75, 0.3])
    assert qf.e2m1_codes(mids).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 0, 10, 1]
    q4, e4 = qf.quantize_mxfp4(torch.full((1, 32), 3.0))  # amax 3: scale 2^(1-2), 3/0.5 = 6
    assert e4.tolist() == [[126]] and torch.equal(qf.dequant_mxfp4(q4, e4), torch.full((1, 32), 3.0))


def test_quark_mxfp4_without_input_tensors_is_weight_only_and_w4a8_mixes_formats():
    from engine.api.quant import MXFP4Method, PerLayer, quark_scheme

    parts, gen = tq.QKV_PARTS, torch.Generator().manual_seed(0)
    dense = tq.qkv_weights(gen)
    tensors, qcfg, ref = tq.quantize_state(dense, "quark_mxfp4")
    qcfg = {**qcfg, "global_quant_config": {**qcfg["global_quant_config"],
                                            "input_tensors": None}}
    name = "model.layers.0.self_attn.qkv_proj"
    layer = tq.load_fused_layer(PerLayer(quark_scheme(qcfg)).for_layer(name), tensors,
                                "model.layers.0.self_attn", parts, 576)
    x = torch.randn(5, 576, generator=gen)
    w = torch.cat([ref[k] for k in dense])
    assert layer.quant_method.act is None
    assert torch.allclose(layer(x), x @ w.T, atol=1e-5, rtol=0)
    # MXFP4 weights with MXFP8 activations (mxfp_w4a8): the activation format is the method's
    w4a8 = tq.load_fused_layer(MXFP4Method(act="mxfp8").bind(name), tensors,
                               "model.layers.0.self_attn", parts, 576)
    assert torch.allclose(w4a8(x), qf.dequant_mxfp8(*qf.quantize_mxfp8(x)) @ w.T, atol=1e-5, rtol=0)


def test_pack_unpack_roundtrip_and_awq_order():
    codes = torch.randint(0, 16, (6, 16), dtype=torch.int32)
    for dim in (0, 1):
        c = codes if dim == 1 else codes.t().contiguous()
        assert torch.equal(qf.unpack_int32(qf.pack_int32(c, 4, dim), 4, dim), c)
    assert torch.equal(qf.awq_unpack(qf.awq_pack(codes)), codes)
    word = qf.awq_pack(torch.arange(8, dtype=torch.int32).reshape(1, 8))
    # nibble i holds column AWQ_ORDER[i]
    assert [(int(word) >> (4 * i)) & 15 for i in range(8)] == list(qf.AWQ_ORDER)
    assert int(qf.pack_int32(torch.full((1, 8), 7, dtype=torch.int32), 4, 1)) == 0x77777777


# ---------------------------------------------------------------- detection and refusals


def test_conflicting_choice_names_both(dense, tmp_path):
    path, _ = dense
    tq.write_checkpoint(path, str(tmp_path / "q"), "fp8_block", block=(64, 64))
    with pytest.raises(ConfigError, match=r"--quantization awq conflicts .* 'fp8'"):
        logits(str(tmp_path / "q"), "awq")


def test_an_online_only_choice_on_a_quantized_checkpoint_is_a_conflict(dense, tmp_path):
    path, _ = dense
    tq.write_checkpoint(path, str(tmp_path / "q"), "gptq")
    with pytest.raises(ConfigError, match="mxfp_w4a8 conflicts with the checkpoint, which is "
                       "quantized with 'gptq'; mxfp_w4a8 only quantizes a dense checkpoint"):
        logits(str(tmp_path / "q"), "mxfp_w4a8")


def test_gptq_on_a_dense_checkpoint_says_no_config(dense):
    with pytest.raises(ConfigError, match="not quantized .*quantize_config.json"):
        logits(dense[0], "gptq")


@pytest.mark.parametrize("edit,pattern", [
    (lambda c: c.update(bits=3), r"quantization_config.bits = 3"),
    (lambda c: c.update(group_size=100), r"group_size = 100 does not divide in_features 576"),
    (lambda c: c.update(group_size=32), r"checkpoint tensor 'model\.layers\.\d+\.[\w.]+"
                                        r"\.(qzeros|scales)': has shape \(\d+, \d+\), expected"),
])
def test_bad_gptq_configs_are_one_line_errors(dense, tmp_path, edit, pattern):
    path, _ = dense
    q = str(tmp_path / "q")
    tq.write_checkpoint(path, q, "gptq")
    cfg_path = os.path.join(q, "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    edit(cfg["quantization_config"])
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh)
    with pytest.raises(ConfigError, match=pattern) as info:
        logits(q)
    assert "\n" not in str(info.value)


def test_quantize_config_json_and_mlx_block_are_detected(dense, tmp_path):
    from engine.models.quant_config import read_quant_config

    path, _ = dense
    q = str(tmp_path / "q")
    tq.write_checkpoint(path, q, "gptq")
    with open(os.path.join(q, "config.json")) as fh:
        cfg = json.load(fh)
    qcfg = cfg.pop("quantization_config")
    del qcfg["quant_method"]
    with open(os.path.join(q, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    with open(os.path.join(q, "quantize_config.json"), "w") as fh:
        json.dump(qcfg, fh)
    assert read_quant_config(q)["quant_method"] == "gptq"
    _, runner = logits(q)
    assert runner.model.quant_method is not None
    m = str(tmp_path / "m")
    tq.write_checkpoint(path, m, "mlx4")
    assert read_quant_config(m)["quant_method"] == "mlx_q4"
    with open(os.path.join(m, "config.json")) as fh:
        cfg = json.load(fh)
    cfg["quantization"]["bits"] = 5
    with open(os.path.join(m, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    with pytest.raises(ConfigError, match="quantization.bits = 5"):
        read_quant_config(m)


def test_bnb_dequantization_equals_the_bitsandbytes_library():
    """Cross-check against the library where it is installed (it is not a dependency)."""
    bnb = pytest.importorskip("bitsandbytes.functional")
    from engine.runtime.quant_formats import dequant_bnb4

    w = torch.randn(192, 576)
    for kind in ("nf4", "fp4"):
        for nested in (True, False):
            q, st = bnb.quantize_4bit(w, blocksize=64, quant_type=kind,
                                      compress_statistics=nested)
            d = st.as_dict(packed=True)
            state = json.loads(bytes(d[f"quant_state.bitsandbytes__{kind}"].tolist()))
            extra = ((d["nested_quant_map"], d["nested_absmax"], state["nested_offset"])
                     if nested else None)
            ours = dequant_bnb4(q, d["quant_map"], d["absmax"], (192, 576), 64, extra)
            assert torch.equal(ours, bnb.dequantize_4bit(q, st).float())


@pytest.mark.parametrize("scheme", ["modelslim_w8a8", "modelslim_w8a8_dynamic", "modelslim_w4a4"])
def test_modelslim_layers_equal_their_integer_arithmetic(scheme):
    """msModelSlim's types against their arithmetic written out in float64: static W8A8 is
    ``((clamp(round(x / s + o)) - o) * s) @ (q * weight_scale)^T`` per fused shard (what
    ``(x_q @ q^T + quant_bias) * deq_scale`` computes); the dynamic types quantize each row
    symmetrically to their width."""
    from engine_quant_modelslim.impl import engine_create_quant_method

    gen = torch.Generator().manual_seed(1)
    sizes = {"q_proj": 192, "k_proj": 64, "v_proj": 64}
    state = {f"model.layers.0.self_attn.{p}.weight": torch.randn(n, 576, generator=gen) * 0.05
             for p, n in sizes.items()}
    tensors, qcfg, ref = tq.quantize_state(state, scheme)
    method = engine_create_quant_method(quant_config=qcfg)
    layer = tq.load_fused_layer(method.for_layer("model.layers.0.self_attn.qkv_proj"), tensors,
                                "model.layers.0.self_attn", sizes, 576)
    x = torch.randn(6, 576, generator=gen)
    got, outs = layer(x), []
    bits = 4 if scheme == "modelslim_w4a4" else 8
    for p in sizes:
        base = f"model.layers.0.self_attn.{p}"
        # the codes as float32 computes them, their values in float64
        if scheme == "modelslim_w8a8":
            s, o = float(tensors[base + ".input_scale"]), float(tensors[base + ".input_offset"])
            xq = ((x / s + o).round().clamp(-128, 127).double() - o) * s
        else:
            top = 2 ** (bits - 1) - 1
            sx = x.abs().amax(1, keepdim=True) / top
            xq = (x / sx).round().clamp(-top - 1, top).double() * sx.double()
        outs.append(xq @ ref[base + ".weight"].double().T)
    want = torch.cat(outs, 1)
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max(), \
        (got.double() - want).abs().max()
    assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(6)]), got)


def test_a_modelslim_checkpoint_is_detected_and_its_int64_deq_scale_read(dense, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _ = dense
    tq.write_checkpoint(path, str(tmp_path / "q"), "modelslim_w8a8")
    assert os.path.isfile(tmp_path / "q" / "quant_model_description.json")
    base, _ = logits(path)
    got, runner = logits(str(tmp_path / "q"))
    assert runner.model.quant_method is not None
    p, q = F.log_softmax(base, -1), F.log_softmax(got, -1)
    assert (p.exp() * (p - q)).sum(-1).mean() < 0.05
    # float16 models store deq_scale as int64 words holding the float32 bits
    file = str(tmp_path / "q" / "model.safetensors")
    state = load_file(file)
    for k in [k for k in state if k.endswith(".deq_scale")]:
        state[k] = state[k].view(torch.int32).to(torch.int64)
    save_file(state, file)
    again, _ = logits(str(tmp_path / "q"))
    assert torch.equal(again, got)


def test_modelslim_types_it_does_not_serve_are_named(dense, tmp_path):
    path, _ = dense
    tq.write_checkpoint(path, str(tmp_path / "q"), "modelslim_w8a8_dynamic")
    desc_file = tmp_path / "q" / "quant_model_description.json"
    desc = json.loads(desc_file.read_text())
    desc["model.layers.0.mlp.down_proj.weight"] = "W4A8_MXFP"
    desc_file.write_text(json.dumps(desc))
    with pytest.raises(ConfigError, match=r"down_proj\.weight = 'W4A8_MXFP': served types"):
        logits(str(tmp_path / "q"))


def test_e2m1_values_on_the_grid_equal_the_code_table():
    """NVFP4's fast rounding (steps of 0.5 / 1 / 2, ties to even, saturating at 6) gives the
    code table's value of ``e2m1_codes`` everywhere, the midpoints included."""
    x = torch.cat([torch.randn(100000, generator=torch.Generator().manual_seed(0)) * 3,
                   torch.arange(-700, 701) / 100.0,
                   torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -2.5, 6.0, 7.0])])
    table = torch.tensor(qf.E2M1_VALUES)
    assert torch.equal(qf.e2m1_values(x), table[qf.e2m1_codes(x)])


def test_nvfp4_row_rounding_in_c_equals_the_torch_ops():
    """The C rounding of NVFP4 activations (a global scale per row) gives the torch ops' values
    bit for bit: rows of different magnitudes, an all-zero block, values under the smallest
    e4m3 block scale."""
    from engine.runtime import fused_cpu

    if not fused_cpu.available():
        pytest.skip("no C kernels here")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 256, generator=gen) * torch.logspace(-4, 3, 9).reshape(-1, 1)
    x[1, 16:32] = 0
    x[2, 40] = 1e4  # one outlier: most blocks of that row fall below e4m3's normal range
    assert torch.equal(fused_cpu.fake_quant_nvfp4_rows(x), qf.fake_quant_nvfp4(x, per_row=True))


def test_online_fp8_keeps_the_parameters_on_the_weights_device():
    """Online quantization after loading makes its fp8 weight and scales where the dense weight
    was (a GPU's, in serving; the meta device here), whatever torch's default device is."""
    from engine.runtime.linear import Linear
    from engine.runtime.quant_methods import Fp8Method

    with torch.device("meta"):
        layer = Linear(64, 32, dtype=torch.float32, quant_method=Fp8Method(online=True))
    layer.process_weights_after_loading()
    assert {p.device.type for p in layer.parameters()} == {"meta"}
    assert layer.weight.shape == (32, 64)  # (off a GPU it is kept dequantized)


def test_dummy_weights_of_a_quantized_config_are_codes_with_unit_scales(dense, tmp_path):
    """``--load-format dummy`` on quantized configs (no weights read): block fp8 codes drawn
    from Normal(0, 0.02) with unit block scales, the same for the same seed; a GPTQ config's
    integer codes zeros (its float scales drawn); both serve a forward."""
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    path, _ = dense
    weights = []
    for scheme, kw, seed in (("fp8_block", {"block": (64, 64)}, 0),
                             ("fp8_block", {"block": (64, 64)}, 0), ("gptq", {}, 0)):
        tq.write_checkpoint(path, str(tmp_path / scheme), scheme, **kw)
        os.remove(tmp_path / scheme / "model.safetensors")
        runner = ModelRunner(ServerConfig(model_path=str(tmp_path / scheme), device="cpu",
                                          load_format="dummy", random_seed=seed,
                                          skip_tokenizer_init=True, max_total_tokens=64,
                                          attention_backend="torch_native",
                                          max_running_requests=1))
        builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        out = runner.forward(builder.extend([(builder.new_request(), IDS[0])]))
        assert torch.isfinite(out).all(), scheme
        # (float32 on the CPU: each layer dequantized at load)
        weights.append(runner.model.model.layers[0].mlp.down_proj.weight)
    w = weights[0]
    assert w.dtype == torch.float32 and 0.015 < w.std().item() < 0.025
    assert torch.equal(w, w.to(torch.float8_e4m3fn).float())  # each value an fp8 code
    assert torch.equal(weights[0], weights[1])
    # zero codes: each group of a GPTQ row one value (its zero point times its scale)
    assert torch.equal(weights[2][:, :128], weights[2][:, :1].expand(-1, 128))
