"""DSPARK (static mode) on tiny random targets, with DSpark drafts written at test time.

No trained DSpark draft is at hand. Random drafts of every Markov head type prove the plumbing
(the output equals plain greedy decoding, batched, after radix-cache hits); a draft whose
backbone is silenced (final norm zero: base logits 0) and whose vanilla Markov head encodes a
bigram target's next-token map drafts that target's own continuation, so every draft is
accepted; the head drafts left to right from the token just drafted.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from test_spec_dflash import dflash_draft  # noqa: E402
from test_spec_eagle import (H, PROMPTS, V, _rand, _save, generate,  # noqa: E402
                             scheduler, target_checkpoint)

from engine.errors import ConfigError  # noqa: E402

LAYERS = 4
RANK = 8


def dspark_draft(root: str, name: str, kind: str, layer_ids: list[int], gamma: int = 4,
                 markov: dict | None = None, **extra) -> str:
    """A DFlash backbone (test_spec_dflash) plus a Markov head of ``kind`` and a confidence
    head (unused in static mode), block size ``gamma``; ``markov`` overrides its tensors."""
    path = dflash_draft(root, name, layer_ids, block=gamma, layers=1)
    from safetensors.torch import load_file

    t = load_file(os.path.join(path, "model.safetensors"))
    gen = torch.Generator().manual_seed(11)
    m = "markov_head."
    t.update({m + "markov_w1.weight": _rand(gen, V, RANK, scale=1.0),
              m + "markov_w2.weight": _rand(gen, V, RANK, scale=1.0),
              "confidence_head.proj.weight": _rand(gen, 1, H + RANK),
              "confidence_head.proj.bias": torch.zeros(1)})
    if kind == "gated":
        t.update({m + "gate_proj.weight": _rand(gen, RANK, H + RANK),
                  m + "gate_proj.bias": _rand(gen, RANK)})
    elif kind == "rnn":
        t.update({m + "joint_proj.weight": _rand(gen, 3 * RANK, 2 * RANK + H),
                  m + "joint_proj.bias": _rand(gen, 3 * RANK)})
    elif kind == "carh":
        t.update({m + "hidden_proj.weight": _rand(gen, RANK, H),
                  m + "depth_embedding.weight": _rand(gen, gamma, RANK),
                  m + "fusion_norm.weight": torch.ones(RANK),
                  m + "fusion_norm.bias": torch.zeros(RANK),
                  m + "gate_proj.weight": _rand(gen, 1, RANK),
                  m + "gate_proj.bias": torch.zeros(1)})
    t.update(markov or {})
    import json

    cfg = json.load(open(os.path.join(path, "config.json")))
    cfg["architectures"] = ["DSparkDraftModel"]
    cfg["dflash_config"].update(markov_rank=int(t[m + "markov_w1.weight"].shape[1]),
                                markov_head_type=kind)
    cfg.update(vocab_size=V, **extra)
    return _save(path, t, cfg)


@pytest.fixture(scope="module")
def files():
    root = tempfile.mkdtemp(prefix="engine-dspark-")
    target, _ = target_checkpoint(root, layers=LAYERS, attention=True)
    bigram, _ = target_checkpoint(os.path.join(root, "bigram"), layers=1, attention=False)
    return {"root": root, "target": target, "bigram": bigram}


@pytest.fixture(scope="module")
def reference(files):
    return generate(scheduler(files["target"]))[0]


@pytest.mark.parametrize("kind,ids", [("vanilla", [0, 2]), ("gated", [LAYERS - 1, 1]),
                                      ("rnn", [1]), ("carh", [0, 3])])
def test_a_random_dspark_draft_gives_exactly_the_greedy_output(files, reference, kind, ids):
    draft = dspark_draft(files["root"], f"ds-{kind}", kind, ids)
    sched = scheduler(files["target"], speculative_algorithm="dspark",
                      speculative_draft_model_path=draft)
    assert sched.spec.proposer.num_draft_tokens == 5  # gamma 4 + the last token
    ids_out, last = generate(sched)
    assert ids_out == reference
    assert all(out.spec_verify_ct > 0 for out in last)
    again, _ = generate(sched, PROMPTS[:2])  # radix-cache hits
    assert again == reference[:2]
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens


def test_a_markov_head_with_the_targets_bigram_map_has_every_draft_accepted(files):
    plain = scheduler(files["bigram"])
    nxt, _ = generate(plain, [[t] for t in range(V)], steps=1)
    follow = torch.tensor([n[0] for n in nxt])  # the bigram target's greedy next token
    bigram_ref = generate(scheduler(files["bigram"]))[0]
    m = "markov_head."
    markov = {m + "markov_w1.weight": torch.eye(V),  # rank V: one direction per token
              m + "markov_w2.weight": 10.0 * torch.nn.functional.one_hot(follow, V).float().T}
    draft = dspark_draft(files["root"], "ds-bigram", "vanilla", [0], gamma=3, markov=markov)
    from safetensors.torch import load_file, save_file

    f = os.path.join(draft, "model.safetensors")
    t = load_file(f)
    t["norm.weight"] = torch.zeros(H)  # the backbone says nothing: base logits are 0
    save_file(t, f)
    sched = scheduler(files["bigram"], speculative_algorithm="DSPARK",
                      speculative_draft_model_path=draft)
    ids, last = generate(sched)
    assert ids == bigram_ref
    for out in last:  # 3 drafts per verify, all accepted
        verified = out.completion_tokens - 1
        assert out.spec_accepted_tokens + out.spec_verify_ct == verified
        assert out.spec_verify_ct == -(-verified // 4)


def test_the_markov_head_drafts_from_the_token_just_drafted():
    from engine_spec_dspark.model import MarkovHead

    head = MarkovHead("vanilla", 10, 10, 4, 4)
    with torch.no_grad():
        head.markov_w1.weight.copy_(torch.eye(10))
        succ = torch.tensor([(t + 3) % 10 for t in range(10)])  # t -> t + 3
        head.markov_w2.weight.copy_(torch.nn.functional.one_hot(succ, 10).float().T)
    base = torch.zeros(2, 4, 10)
    base[1, 1, 0] = 5.0  # request 1: row 1's own logits win there; row 2 follows from 0
    got = head.greedy(base, torch.tensor([2, 2]), torch.zeros(2, 4, 4))
    assert got.tolist() == [[5, 8, 1, 4], [5, 0, 3, 6]]


def test_the_block_size_option_and_refusals(files):
    root = files["root"]
    draft = dspark_draft(root, "ds-opt", "vanilla", [0])
    sched = scheduler(files["target"], speculative_algorithm="dspark",
                      speculative_draft_model_path=draft,
                      plugin_options={"speculative.dspark": {
                          "speculative_dspark_block_size": 2}})
    assert sched.spec.proposer.num_draft_tokens == 3
    sched = scheduler(files["target"], speculative_algorithm="dspark",
                      speculative_draft_model_path=draft, speculative_num_draft_tokens=6)
    assert sched.spec.proposer.num_draft_tokens == 6
    cases = [
        (dspark_draft(root, "ds-norank", "vanilla", [0], markov={
            "markov_head.markov_w1.weight": torch.zeros(V, 0),
            "markov_head.markov_w2.weight": torch.zeros(V, 0)}), "markov_rank 0"),
        (dspark_draft(root, "ds-kind", "vanilla", [0], markov_head_type="mlp",
                      dspark_markov_head_type="mlp"), "markov_head_type 'mlp'"),
        (dspark_draft(root, "ds-vocab", "vanilla", [0], draft_vocab_size=V // 2),
         f"vocabulary has {V // 2} tokens"),
    ]
    for path, reason in cases:
        with pytest.raises(ConfigError, match=reason):
            scheduler(files["target"], speculative_algorithm="DSPARK",
                      speculative_draft_model_path=path)
    with pytest.raises(ConfigError, match="needs a DSpark draft"):
        scheduler(files["target"], speculative_algorithm="DSPARK")
    with pytest.raises(ConfigError, match="differ"):
        scheduler(files["target"], speculative_algorithm="dspark",
                  speculative_draft_model_path=draft, speculative_num_draft_tokens=4,
                  plugin_options={"speculative.dspark": {"speculative_dspark_block_size": 2}})
