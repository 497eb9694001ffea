"""Mixture-of-experts architectures through ModelRunner equal transformers on the same files.

Tiny random checkpoints of each architecture are written by transformers at test time (2 layers,
hidden 64); both sides run float32 on the CPU: greedy tokens equal, logits close. Covers softmax
top-k with and without renormalisation, Qwen2-MoE's gated shared expert and a dense layer among
sparse ones (``mlp_only_layers``), E not a power of two, Mixtral's names, OLMoE's
whole-projection q/k norms and ``clip_qkv``, and both per-expert and stacked expert tensors.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtime"))

from _default_model import greedy  # noqa: E402
from _tiny import ARCHS, checkpoint, hf_model, stacked_checkpoint  # noqa: E402

from engine.config import ServerConfig  # noqa: E402
from engine.errors import ConfigError  # noqa: E402
from engine.runtime.model_runner import ModelRunner  # noqa: E402
from engine.testing.batches import BatchBuilder  # noqa: E402

STEPS = 12
PROMPTS = [[5, 17, 99, 3, 42, 7, 200, 31], [9, 8, 7], [150, 151, 2, 60, 61, 62, 63, 64, 65, 66,
                                                      12, 13, 14]]


def runner_for(path: str, **kw) -> ModelRunner:
    config = ServerConfig(model_path=path, device="cpu", dtype="float32",
                          skip_tokenizer_init=True, attention_backend="torch_native",
                          max_total_tokens=1024, max_running_requests=4, **kw)
    return ModelRunner(config)


def hf_reference(arch: str) -> list[tuple[list[int], torch.Tensor]]:
    hf = hf_model(arch)
    out = []
    with torch.no_grad():
        for ids in PROMPTS:
            x = torch.tensor([ids])
            logits = hf(x).logits[0, -1]
            gen = hf.generate(x, max_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                              pad_token_id=0, attention_mask=torch.ones_like(x))
            out.append((gen[0, len(ids):].tolist(), logits))
    return out


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_and_logits_match_transformers(arch):
    runner = runner_for(checkpoint(arch))
    mc = runner.model_config
    assert mc.architecture == arch and "moe" in mc.features and mc.num_experts > 0
    reference = hf_reference(arch)
    for i, ids in enumerate(PROMPTS):  # alone
        ours, logits = greedy(runner, [ids], STEPS)
        assert ours[0] == reference[i][0], f"{arch} prompt {i}"
        assert torch.allclose(logits[0], reference[i][1], atol=1e-4, rtol=0), \
            (logits[0] - reference[i][1]).abs().max()
    ours, logits = greedy(runner, PROMPTS, STEPS)  # one ragged batch
    for i in range(len(PROMPTS)):
        assert ours[i] == reference[i][0], f"{arch} prompt {i} differs when batched"
        assert torch.allclose(logits[i], reference[i][1], atol=1e-4, rtol=0)


def test_config_fields_per_family():
    q2 = runner_for(checkpoint("Qwen2MoeForCausalLM")).model_config
    assert (q2.num_experts, q2.num_experts_per_tok, q2.moe_intermediate_size) == (6, 3, 32)
    assert q2.shared_expert_intermediate_size == 48 and q2.shared_expert_gate
    assert not q2.norm_topk_prob and q2.is_sparse_layer(0) and not q2.is_sparse_layer(1)
    assert "shared_experts" in q2.features
    mx = runner_for(checkpoint("MixtralForCausalLM")).model_config
    assert mx.norm_topk_prob and mx.moe_intermediate_size == 48 and mx.num_experts == 4
    ol = runner_for(checkpoint("OlmoeForCausalLM")).model_config
    assert ol.qk_norm and ol.qk_norm_scope == "full" and ol.clip_qkv == 3.0


def test_stacked_expert_tensors_load_the_same_model():
    arch = "Qwen3MoeForCausalLM"
    a = runner_for(checkpoint(arch))
    b = runner_for(stacked_checkpoint(arch))
    ids = PROMPTS[0]
    assert greedy(a, [ids], 4)[0] == greedy(b, [ids], 4)[0]
    assert torch.equal(a.model.model.layers[0].mlp.experts.w13,
                       b.model.model.layers[0].mlp.experts.w13)


def test_layers_can_be_shrunk_with_override_args():
    runner = runner_for(checkpoint("MixtralForCausalLM"), load_format="dummy",
                        json_model_override_args=json.dumps({"num_hidden_layers": 1}))
    assert len(runner.model.model.layers) == 1
    assert greedy(runner, [PROMPTS[1]], 2)[0][0]


def _edit_config(tmp_path, arch: str, **changes) -> str:
    path = str(tmp_path / "ckpt")
    shutil.copytree(checkpoint(arch), path)
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    if "num_experts" in changes and "num_local_experts" in cfg:  # transformers 5 writes this
        changes["num_local_experts"] = changes.pop("num_experts")
    cfg.update(changes)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return path


def test_checkpoint_with_more_experts_than_the_config_is_refused(tmp_path):
    path = _edit_config(tmp_path, "Qwen3MoeForCausalLM", num_experts=4)
    with pytest.raises(ConfigError, match=r"expert 4.*says 4 experts|4 experts"):
        runner_for(path)


def test_checkpoint_with_fewer_experts_than_the_config_is_refused(tmp_path):
    path = _edit_config(tmp_path, "Qwen3MoeForCausalLM", num_experts=10)
    with pytest.raises(ConfigError, match=r"mlp.gate.weight. has shape \(8, 64\), expected \(10, 64\)"):
        runner_for(path)


def test_expert_width_disagreeing_with_the_config_is_refused(tmp_path):
    path = _edit_config(tmp_path, "Qwen3MoeForCausalLM", moe_intermediate_size=40)
    with pytest.raises(ConfigError, match=r"expert 0 .*projection has shape"):
        runner_for(path)


DATA = os.path.join(os.path.dirname(__file__), "..", "data")


@pytest.mark.parametrize("name,fields", [
    ("mixtral-8x7b-dummy", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336,
                                norm_topk_prob=True, shared_expert_intermediate_size=0)),
    ("qwen1.5-moe-a2.7b-dummy", dict(num_experts=60, num_experts_per_tok=4,
                                     moe_intermediate_size=1408, norm_topk_prob=False,
                                     shared_expert_intermediate_size=5632,
                                     shared_expert_gate=True, attention_bias=True)),
    ("qwen3-30b-a3b-dummy", dict(num_experts=128, num_experts_per_tok=8,
                                 moe_intermediate_size=768, norm_topk_prob=True, qk_norm=True,
                                 qk_norm_scope="head")),
    ("olmoe-1b-7b-dummy", dict(num_experts=64, num_experts_per_tok=8, moe_intermediate_size=1024,
                               norm_topk_prob=False, qk_norm=True, qk_norm_scope="full")),
])
def test_published_configs_parse_to_their_routing(name, fields):
    from engine.models.parsing import read_hf_dir

    cfg = read_hf_dir(os.path.join(DATA, name))
    for key, value in fields.items():
        assert getattr(cfg, key) == value, key
    assert all(cfg.is_sparse_layer(i) for i in range(cfg.num_hidden_layers))


@pytest.mark.parametrize("scheme,kw", [("gptq", {"group": 32}), ("awq", {"group": 32}),
                                       ("modelopt_nvfp4", {})])
def test_weight_only_quantized_experts_load_dequantized(tmp_path, scheme, kw):
    """A GPTQ / AWQ / NVFP4 checkpoint of a MoE model (every linear, each expert's too): the
    experts are dequantized at load, so the logits equal the dense model's with the format's
    dequantized weights."""
    from safetensors.torch import load_file, save_file

    from engine.testing import quant as tq

    src = checkpoint("Qwen3MoeForCausalLM")
    ref = tq.write_checkpoint(src, str(tmp_path / "q"), scheme, **kw)
    assert any(".experts.3.down_proj." in k for k in ref)
    dense = tmp_path / "ref"
    dense.mkdir()
    shutil.copy(os.path.join(src, "config.json"), dense / "config.json")
    state = load_file(os.path.join(src, "model.safetensors"))
    save_file({**state, **ref}, str(dense / "model.safetensors"))
    a, b = runner_for(str(tmp_path / "q")), runner_for(str(dense))
    assert a.model.quant_method is not None
    assert torch.allclose(a.model.model.layers[1].mlp.experts.w2,
                          b.model.model.layers[1].mlp.experts.w2, atol=1e-6, rtol=0)
    ids = PROMPTS[0]
    assert greedy(a, [ids], 4)[0] == greedy(b, [ids], 4)[0]


def test_a_quantized_expert_missing_a_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from engine.testing import quant as tq

    tq.write_checkpoint(checkpoint("Qwen3MoeForCausalLM"), str(tmp_path / "q"), "gptq",
                        group=32)
    path = str(tmp_path / "q" / "model.safetensors")
    state = load_file(path)
    del state["model.layers.0.mlp.experts.5.up_proj.scales"]
    save_file(state, path)
    with pytest.raises(ConfigError, match=r"lacks scales of model\.layers\.0\.mlp\.experts\.5"
                       r"\.up_proj"):
        runner_for(str(tmp_path / "q"))


def test_quantized_experts_are_refused_at_load():
    from engine.api.moe import LocalAllToAll
    from engine.models.loader import load_model
    from engine.models.parsing import read_hf_dir
    from engine.runtime.linear import QuantMethod
    from engine_moe_torch.impl import TorchRunner

    class Int8(QuantMethod):
        def create_weights(self, layer, in_features, out_features, dtype):
            layer.register_parameter("weight", torch.nn.Parameter(
                torch.empty(out_features, in_features), requires_grad=False))

        def apply(self, layer, x, bias):
            return x @ layer.weight.t()

    cfg = read_hf_dir(checkpoint("Qwen3MoeForCausalLM"))
    # a method that computes with more than a dense weight (here: its own product) is refused
    with pytest.raises(ConfigError, match=r"routed experts quantized by Int8 are not served"):
        load_model(cfg, ServerConfig(load_format="dummy"), torch.device("cpu"), torch.float32,
                   quant_method=Int8(), experts=(TorchRunner(), LocalAllToAll()))


def _fp8_channel(w):
    from engine.runtime import quant_formats as qf

    s = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0
    return qf.quantize_fp8(w, s, torch.float8_e4m3fn).float() * s


def _fp8_rows(x):
    from engine.runtime import quant_formats as qf

    return qf.fake_quant_fp8(x, torch.float8_e4m3fn)


def _mx(fmt):
    from engine.runtime import quant_formats as qf

    quantize, dequantize = {"mxfp8": (qf.quantize_mxfp8, qf.dequant_mxfp8),
                            "mxfp4": (qf.quantize_mxfp4, qf.dequant_mxfp4)}[fmt]
    return lambda t: dequantize(*quantize(t))


def _nvfp4(per_row):
    from engine.runtime import quant_formats as qf

    return lambda t: qf.fake_quant_nvfp4(t, per_row=per_row)


def _int4_channel(w):
    s = (w.abs().amax(1, keepdim=True) / 7).clamp(min=1e-12)
    return torch.round(w / s).clamp(-8, 7) * s


#: online choice -> (an expert projection's kept weight values, the rounding of its input rows),
#: written out here from each format's definition
ONLINE_EXPERTS = {"fp8": (_fp8_channel, _fp8_rows), "w8a8_fp8": (_fp8_channel, _fp8_rows),
                  "mxfp8": (_mx("mxfp8"), _mx("mxfp8")),
                  "mxfp_w4a8": (_mx("mxfp4"), _mx("mxfp8")),
                  "quark_int4fp8_moe": (_int4_channel, _fp8_rows),
                  "nvfp4_online": (_nvfp4(False), _nvfp4(True)), "mxfp4": (_mx("mxfp4"), None)}


@pytest.mark.parametrize("choice", sorted(ONLINE_EXPERTS))
def test_online_quantized_experts_keep_the_formats_values(choice):
    """A dense MoE checkpoint served with an online choice: each expert projection holds the
    values the format keeps (gate and up quantized as separate tensors), the torch runner
    rounds the rows each expert multiplies as the format's activations are rounded, and the
    model decodes."""
    from engine.models.moe import route, torch_reference

    quantized = runner_for(checkpoint("Qwen3MoeForCausalLM"), quantization=choice)
    dense = runner_for(checkpoint("Qwen3MoeForCausalLM"))
    weights, rows = ONLINE_EXPERTS[choice]
    block, ref = quantized.model.model.layers[1].mlp, dense.model.model.layers[1].mlp
    inter = ref.experts.intermediate_size
    for e in range(ref.experts.num_experts):
        w13 = ref.experts.w13[e]
        assert torch.equal(block.experts.w13[e],
                           torch.cat([weights(w13[:inter]), weights(w13[inter:])])), e
        assert torch.equal(block.experts.w2[e], weights(ref.experts.w2[e])), e
    h = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    topk_w, ids = route(block.gate(h), block.top_k, block.renormalize)
    got = block.runner.apply(block.experts, h, ids, topk_w)
    w13, w2 = block.experts.w13.float(), block.experts.w2.float()
    want = torch_reference(w13, w2, h, ids, topk_w, act=(rows, rows) if rows else None)
    plain = torch_reference(w13, w2, h, ids, topk_w)
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert (block.experts.act_quant is None) == (rows is None)
    if rows is not None:
        assert not torch.allclose(got, plain, atol=1e-5, rtol=0)  # the rounding is there
    ids_out, _ = greedy(quantized, [PROMPTS[0]], 4)
    assert len(ids_out[0]) == 4


@pytest.mark.parametrize("scheme,kw", [("ct_fp8_dynamic", {}), ("fp8_block", {"block": (32, 32)}),
                                       ("ct_w8a8_int8", {}), ("mxfp8", {})])
def test_activation_quantized_expert_checkpoints_load(tmp_path, scheme, kw):
    """fp8 (per channel, per block), int8 W8A8 and MXFP8 checkpoints of a MoE model: each
    expert holds the format's dequantized weights and its activations are rounded."""
    from engine.testing import quant as tq

    ref = tq.write_checkpoint(checkpoint("Qwen3MoeForCausalLM"), str(tmp_path / "q"), scheme,
                              **kw)
    runner = runner_for(str(tmp_path / "q"))
    experts = runner.model.model.layers[1].mlp.experts
    for e in (0, 3):
        want = ref[f"model.layers.1.mlp.experts.{e}.down_proj.weight"]
        # (float32 or, where every value is one, 16-bit: keep_16bit_on_cpu)
        assert torch.allclose(experts.w2[e].float(), want, atol=1e-6, rtol=0), e
    assert experts.act_quant is not None
    ids_out, _ = greedy(runner, [PROMPTS[0]], 4)
    assert len(ids_out[0]) == 4


def test_w4afp8_checkpoint_int4_experts_with_static_fp8_activations(tmp_path):
    """A w4afp8 checkpoint of a MoE model: each expert holds its int4 codes times their group
    scales, the rows each layer's experts multiply are rounded to fp8 with the largest of that
    layer's input scales (one for the gate/up inputs, one for the down inputs), and the other
    linear layers are block fp8."""
    from safetensors.torch import load_file

    from engine.models.moe import route, torch_reference
    from engine.runtime import quant_formats as qf
    from engine.runtime.quant_methods import Fp8Method
    from engine.testing import quant as tq

    ref = tq.write_checkpoint(checkpoint("Qwen3MoeForCausalLM"), str(tmp_path / "q"), "w4afp8",
                              group=32, block=(32, 32))
    state = load_file(str(tmp_path / "q" / "model.safetensors"))
    runner = runner_for(str(tmp_path / "q"))
    block = runner.model.model.layers[1].mlp
    for e in (0, 5):
        want = ref[f"model.layers.1.mlp.experts.{e}.down_proj.weight"]
        assert torch.allclose(block.experts.w2[e], want, atol=1e-6, rtol=0), e
    assert isinstance(runner.model.model.layers[0].self_attn.qkv_proj.quant_method, Fp8Method)

    def largest(projs):
        return max(float(state[f"model.layers.1.mlp.experts.{e}.{p}.input_scale"])
                   for e in range(block.experts.num_experts) for p in projs)

    def static(scale):
        s = torch.tensor(scale)
        return lambda x: qf.fake_quant_fp8(x, torch.float8_e4m3fn, scale=s)

    h = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    topk_w, ids = route(block.gate(h), block.top_k, block.renormalize)
    got = block.runner.apply(block.experts, h, ids, topk_w)
    want = torch_reference(block.experts.w13, block.experts.w2, h, ids, topk_w,
                           act=(static(largest(("gate_proj", "up_proj"))),
                                static(largest(("down_proj",)))))
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    ids_out, _ = greedy(runner, [PROMPTS[0]], 4)
    assert len(ids_out[0]) == 4


def test_a_gpt_oss_mxfp4_checkpoint_is_refused_with_the_reason():
    from engine_quant_mxfp4.impl import engine_create_quant_method

    with pytest.raises(ConfigError, match=r"gpt-oss architecture, which this build does not "
                       r"serve"):
        engine_create_quant_method(quant_config={"quant_method": "mxfp4"})


@pytest.mark.parametrize("scheme", ["fp8_tensor", "ct_fp8_static"])
def test_static_fp8_expert_checkpoints_share_the_layers_largest_input_scale(tmp_path, scheme):
    """Experts with static activation scales: each layer's gate/up inputs are rounded with the
    largest of its experts' gate/up ``input_scale``, its down inputs with the largest down
    one, as MoE kernels reduce them."""
    from safetensors.torch import load_file

    from engine.models.moe import route, torch_reference
    from engine.runtime import quant_formats as qf
    from engine.testing import quant as tq

    tq.write_checkpoint(checkpoint("Qwen3MoeForCausalLM"), str(tmp_path / "q"), scheme)
    state = load_file(str(tmp_path / "q" / "model.safetensors"))
    runner = runner_for(str(tmp_path / "q"))
    block = runner.model.model.layers[0].mlp

    def rounding(projs):
        s = max(float(state[f"model.layers.0.mlp.experts.{e}.{p}.input_scale"].max())
                for e in range(block.experts.num_experts) for p in projs)
        return lambda x: qf.fake_quant_fp8(x, torch.float8_e4m3fn, scale=torch.tensor(s))

    h = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    topk_w, ids = route(block.gate(h), block.top_k, block.renormalize)
    got = block.runner.apply(block.experts, h, ids, topk_w)
    want = torch_reference(block.experts.w13, block.experts.w2, h, ids, topk_w,
                           act=(rounding(("gate_proj", "up_proj")), rounding(("down_proj",))))
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()


def test_an_all_to_all_that_needs_several_ranks_is_refused_with_its_reason():
    from engine.cli.args import parse_config
    from engine.plugins.registry import Registry

    with pytest.raises(ConfigError, match=r"--moe-a2a-backend deepep .*several GPUs"):
        parse_config(["--moe-a2a-backend", "deepep"], Registry())
    with pytest.raises(ConfigError, match=r"--ep-size"):
        parse_config(["--ep-size", "2"], Registry())


@pytest.mark.parametrize("arch", ["Qwen2MoeForCausalLM", "MixtralForCausalLM"])
def test_16_bit_experts_in_a_float32_model_give_the_float32_logits(tmp_path, monkeypatch, arch):
    """A bfloat16 checkpoint served in float32 on the CPU keeps its routed experts in bfloat16
    (the CPU expert kernels widen them exactly as they read): the same logits, bit for bit, as
    with the experts widened to float32 at load (``ENGINE_CPU_HALF_WEIGHTS=0``)."""
    from engine.runtime import fused_cpu

    if not fused_cpu.available():
        pytest.skip("needs the CPU kernels")
    path = str(tmp_path / "bf16")
    hf_model(arch).to(torch.bfloat16).save_pretrained(path)
    results = {}
    for keep in ("1", "0"):
        monkeypatch.setenv("ENGINE_CPU_HALF_WEIGHTS", keep)
        runner = runner_for(path)
        experts = [m for m in runner.model.modules() if hasattr(m, "keep_16bit_on_cpu")]
        assert experts and {e.w13.dtype for e in experts} == {
            torch.bfloat16 if keep == "1" else torch.float32}
        b = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
        rows = [b.new_request() for _ in PROMPTS]
        logits = [runner.forward(b.extend(list(zip(rows, PROMPTS))))]
        for _ in range(4):
            toks = logits[-1].argmax(-1).tolist()
            logits.append(runner.forward(b.decode(list(zip(rows, toks)))))
        results[keep] = torch.cat(logits)
    assert torch.equal(results["1"], results["0"])
