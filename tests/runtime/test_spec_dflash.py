"""DFLASH on a tiny random target with DFlash drafts written at test time.

No trained DFlash draft is at hand, so these prove the plumbing (the fact sheet's first test):
with a random draft the output equals plain greedy decoding token for token, batched, with the
feature layers in any order and the last layer among them, and drafts are verified; a draft
that does not fit is refused at start-up with the reason.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from test_spec_eagle import (H, I, PROMPTS, V, _rand, _save, generate,  # noqa: E402
                             scheduler, target_checkpoint)

from engine.errors import ConfigError  # noqa: E402

LAYERS = 4


def dflash_draft(root: str, name: str, layer_ids: list[int], block: int = 4, layers: int = 2,
                 **extra) -> str:
    gen = torch.Generator().manual_seed(7)
    t = {"fc.weight": _rand(gen, H, len(layer_ids) * H), "hidden_norm.weight": torch.ones(H),
         "norm.weight": torch.ones(H)}
    for i in range(layers):
        p = f"layers.{i}."
        t.update({p + "self_attn.q_proj.weight": _rand(gen, H, H),
                  p + "self_attn.k_proj.weight": _rand(gen, H // 2, H),
                  p + "self_attn.v_proj.weight": _rand(gen, H // 2, H),
                  p + "self_attn.o_proj.weight": _rand(gen, H, H),
                  p + "self_attn.q_norm.weight": torch.ones(16),
                  p + "self_attn.k_norm.weight": torch.ones(16),
                  p + "mlp.gate_proj.weight": _rand(gen, I, H),
                  p + "mlp.up_proj.weight": _rand(gen, I, H),
                  p + "mlp.down_proj.weight": _rand(gen, H, I),
                  p + "input_layernorm.weight": torch.ones(H),
                  p + "post_attention_layernorm.weight": torch.ones(H)})
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": layers, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "block_size": block,
           "dflash_config": {"target_layer_ids": layer_ids, "mask_token_id": V - 1}, **extra}
    return _save(os.path.join(root, name), t, cfg)


@pytest.fixture(scope="module")
def files():
    root = tempfile.mkdtemp(prefix="engine-dflash-")
    target, _ = target_checkpoint(root, layers=LAYERS, attention=True)
    return {"root": root, "target": target,
            "draft": dflash_draft(root, "dflash", [0, 2]),
            "shuffled": dflash_draft(root, "shuffled", [LAYERS - 1, 1, 2], block=5)}


@pytest.fixture(scope="module")
def reference(files):
    return generate(scheduler(files["target"]))[0]


@pytest.mark.parametrize("draft,width", [("draft", None), ("shuffled", None), ("draft", 6)])
def test_a_random_dflash_draft_gives_exactly_the_greedy_output(files, reference, draft, width):
    extra = {"speculative_num_draft_tokens": width} if width else {}
    sched = scheduler(files["target"], speculative_algorithm="DFLASH",
                      speculative_draft_model_path=files[draft], **extra)
    proposer = sched.spec.proposer
    assert proposer.num_draft_tokens == (width or (5 if draft == "shuffled" else 4))
    assert not proposer.drafts_trees
    ids, last = generate(sched)
    assert ids == reference
    assert all(out.spec_verify_ct > 0 for out in last)
    assert sched.spec.stats.draft_tokens >= sched.spec.stats.verify_forwards
    again, _ = generate(sched, PROMPTS[:2])  # radix-cache hits: the cached prefix has features
    assert again == reference[:2]
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens


def test_the_block_size_option_sets_the_verify_width(files):
    sched = scheduler(files["target"], speculative_algorithm="dflash",
                      speculative_draft_model_path=files["draft"],
                      plugin_options={"speculative.dflash": {
                          "speculative_dflash_block_size": 3}})
    assert sched.spec.proposer.num_draft_tokens == 3


def test_drafts_that_do_not_fit_are_refused(files):
    root = files["root"]
    cases = [
        (dflash_draft(root, "no-mask", [0], dflash_config={"target_layer_ids": [0]}),
         "mask_token_id"),
        (dflash_draft(root, "deep", [LAYERS]), "target_layer_ids"),
        (dflash_draft(root, "dflash2", [0], dflash_config={
            "target_layer_ids": [0], "mask_token_id": 1, "conv_kernel_size": 4}), "DFlash2"),
        (dflash_draft(root, "scaled", [0], rope_scaling={"rope_type": "llama3"}),
         "rope_scaling llama3"),
    ]
    for path, reason in cases:
        with pytest.raises(ConfigError, match=reason):
            scheduler(files["target"], speculative_algorithm="DFLASH",
                      speculative_draft_model_path=path)
    sched = scheduler(files["target"], speculative_algorithm="DFLASH",  # forced to a chain
                      speculative_draft_model_path=files["draft"], speculative_eagle_topk=2,
                      speculative_num_steps=3)
    assert not sched.spec.proposer.drafts_trees
    with pytest.raises(ConfigError, match="needs a DFlash draft"):
        scheduler(files["target"], speculative_algorithm="DFLASH")
    broken = dflash_draft(root, "broken", [0])
    cfg = json.load(open(os.path.join(broken, "config.json")))
    cfg["num_hidden_layers"] = 3
    json.dump(cfg, open(os.path.join(broken, "config.json"), "w"))
    with pytest.raises(ConfigError, match="missing tensors layers.2"):
        scheduler(files["target"], speculative_algorithm="DFLASH",
                  speculative_draft_model_path=broken)


def test_batched_blocks_draft_what_each_request_alone_drafts(files, reference):
    """Every request's block runs in one forward over the row cache (new context padded to
    the block's width); its drafts equal those of the head run on one request at a time with
    a contiguous cache (the reference forward), through verifies and prefix hits."""
    from engine.api.speculative import HeadCache

    sched = scheduler(files["target"], speculative_algorithm="DFLASH",
                      speculative_draft_model_path=files["shuffled"])
    proposer = sched.spec.proposer
    head, target, width = proposer.head, proposer.target, proposer.num_draft_tokens
    batched = proposer.propose
    seqs: dict = {}
    compared = []

    def both(requests):
        got = batched(requests)
        for req, draft in zip(requests, got):
            kv = req.kv_len
            seq = seqs.get(req)
            if seq is None or seq.fed > kv:
                seq = seqs[req] = HeadCache(len(head.layers), torch.device("cpu"), torch.float32)
            feats = target.features(req, seq.fed, kv)
            if proposer._perm is not None:
                feats = feats.index_select(1, proposer._perm)
            last = req.output_ids[-1] if req.output_ids else req.origin_input_ids[-1]
            block = torch.tensor([last] + [head.cfg.mask_token_id] * (width - 1))
            hidden = head(target.embed(block), feats, torch.arange(seq.fed, kv),
                          torch.arange(kv, kv + width), seq.caches)
            seq.fed = kv
            assert draft.token_ids == target.logits(hidden[1:]).argmax(-1).tolist()
            compared.append(req)
        return got

    proposer.propose = both
    ids, _ = generate(sched)
    assert ids == reference
    again, _ = generate(sched, PROMPTS[:2])  # prefix hits: new rows start from the cache
    assert again == reference[:2]
    assert len(compared) > 10
