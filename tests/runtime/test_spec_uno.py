"""UNO and the LoRA adapters it drafts with, on a tiny random target.

No trained UNO adapter is at hand, so these prove the plumbing: with random adapters the output
equals plain greedy decoding token for token, batched and after radix-cache hits; the first row
of each draft block runs without the adapter, so its draft (the target's own next token) is
accepted in every verify; adapters are applied as PEFT defines them, fused q/k/v and gate/up
included; what cannot be applied is refused at start-up with the reason.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from test_spec_eagle import PROMPTS, generate, scheduler, target_checkpoint  # noqa: E402

from engine.errors import ConfigError  # noqa: E402
from engine.runtime.lora import LoraAdapter  # noqa: E402
from engine.testing.lora import ATTENTION, write_adapter  # noqa: E402


@pytest.fixture(scope="module")
def files():
    root = tempfile.mkdtemp(prefix="engine-uno-")
    target, _ = target_checkpoint(root, layers=3, attention=True)
    cfg = json.load(open(os.path.join(target, "config.json")))
    return {"root": root, "target": target, "cfg": cfg,
            "adapter": write_adapter(os.path.join(root, "lora"), cfg, rank=4),
            "attention": write_adapter(os.path.join(root, "lora-attn"), cfg, rank=2,
                                       targets=("q_proj", "v_proj"), seed=3,
                                       extra_config={"use_rslora": True})}


@pytest.fixture(scope="module")
def reference(files):
    return generate(scheduler(files["target"]))[0]


def uno(files, width=4, **extra):
    if "lora" in extra:
        lora = extra.pop("lora")
        extra["plugin_options"] = {"speculative.uno": {"uno_lora_path": lora}}
    return scheduler(files["target"], speculative_algorithm="uno",
                     speculative_num_draft_tokens=width, **extra)


@pytest.mark.parametrize("width,adapter,page", [(4, "adapter", 1), (2, "attention", 4),
                                                (5, None, 16)])
def test_uno_gives_exactly_the_greedy_output(files, reference, width, adapter, page):
    """(The last step of each run has no room for drafts: the block's slots are given back
    before the plain decode, whatever the page size.)"""
    extra = {"lora": files[adapter]} if adapter else {"speculative_draft_load_format": "dummy"}
    sched = uno(files, width, page_size=page, **extra)
    assert sched.spec.proposer.num_draft_tokens == width + 1
    ids, last = generate(sched)
    assert ids == reference
    stats = sched.spec.stats
    assert all(out.spec_verify_ct > 0 for out in last)
    assert stats.draft_tokens >= width * (stats.verified_requests - len(PROMPTS))
    # the first row is the target alone: its draft is the target's next token, accepted in
    # every verify whose draft was not cut short by the request's last tokens
    assert stats.accepted_tokens >= stats.verified_requests - len(PROMPTS)
    again, _ = generate(sched, PROMPTS[:2])  # radix-cache hits
    assert again == reference[:2]
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens


def _dense(layer) -> torch.Tensor:
    return layer.weight.float()


def test_an_adapter_adds_its_scaled_low_rank_product_on_the_chosen_rows(files):
    from safetensors.torch import load_file

    sched = scheduler(files["target"])
    model = sched.runner.model
    adapter = LoraAdapter.load(files["attention"], model, device=torch.device("cpu"),
                               dtype=torch.float32)
    assert adapter.scaling == pytest.approx(8.0 / math.sqrt(2))  # rsLoRA: alpha / sqrt(r)
    assert set(adapter.layers) == {f"model.layers.{i}.self_attn.qkv_proj" for i in range(3)}
    tensors = load_file(os.path.join(files["attention"], "adapter_model.safetensors"))
    layer = model.model.layers[1].self_attn.qkv_proj
    q_out, kv_out = layer.shards[0], layer.shards[1]
    x = torch.randn(5, layer.in_features)
    rows = torch.tensor([False, True, True, False, True])
    base = layer(x)
    with adapter.applied(rows.nonzero().squeeze(1)):
        got = layer(x)
    key = "base_model.model.model.layers.1.self_attn.{}.lora_{}.weight"
    delta = torch.zeros_like(base)
    for name, lo, hi in (("q_proj", 0, q_out), ("v_proj", q_out + kv_out, q_out + 2 * kv_out)):
        a, b = tensors[key.format(name, "A")], tensors[key.format(name, "B")]
        delta[:, lo:hi] = adapter.scaling * (x @ a.T @ b.T)
    want = base + delta * rows[:, None]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[:, q_out:q_out + kv_out], base[:, q_out:q_out + kv_out])  # k: none
    assert torch.equal(layer(x), base)  # outside the block: the target alone


def test_an_adapter_on_every_row_equals_the_merged_weights(files):
    sched = scheduler(files["target"])
    model = sched.runner.model
    adapter = LoraAdapter.load(files["adapter"], model, device=torch.device("cpu"),
                               dtype=torch.float32)
    assert adapter.scaling == pytest.approx(2.0)
    for name, (layer, a, b) in adapter.layers.items():
        x = torch.randn(3, layer.in_features)
        merged = x @ (_dense(layer) + b @ a).T
        with adapter.applied():
            torch.testing.assert_close(layer(x), merged, rtol=1e-4, atol=1e-4)
    assert len(adapter.layers) == 3 * 4  # qkv, o, gate_up, down per layer


def test_adapters_that_cannot_be_applied_are_refused(files):
    root, cfg = files["root"], files["cfg"]
    small = dict(cfg, hidden_size=cfg["hidden_size"] // 2, intermediate_size=8)
    cases = [
        (write_adapter(os.path.join(root, "dora"), cfg, extra_config={"use_dora": True}),
         "DoRA"),
        (write_adapter(os.path.join(root, "shape"), small, targets=ATTENTION), "A \\(4, 64\\)"),
        (write_adapter(os.path.join(root, "saved"), cfg,
                       extra_config={"modules_to_save": ["lm_head"]}), "modules_to_save"),
        (os.path.join(root, "missing"), "not a folder"),
    ]
    for path, reason in cases:
        with pytest.raises(ConfigError, match=reason):
            uno(files, lora=path)
    deep = write_adapter(os.path.join(root, "deep"), dict(cfg, num_hidden_layers=5))
    with pytest.raises(ConfigError, match="the model has no model.layers.3"):
        uno(files, lora=deep)


def test_uno_setups_it_cannot_serve_are_refused(files):
    with pytest.raises(ConfigError, match="needs --uno-lora-path"):
        uno(files)
    with pytest.raises(ConfigError, match="needs --speculative-num-draft-tokens"):
        scheduler(files["target"], speculative_algorithm="UNO",
                  speculative_draft_load_format="dummy")
    with pytest.raises(ConfigError, match="tree mode is not built"):
        uno(files, speculative_draft_load_format="dummy", speculative_eagle_topk=2)
    with pytest.raises(ConfigError, match="no --speculative-draft-model-path"):
        uno(files, speculative_draft_load_format="dummy",
            speculative_draft_model_path=files["target"])
