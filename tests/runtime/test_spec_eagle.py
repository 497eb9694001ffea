"""EAGLE, EAGLE3 and NEXTN on a tiny random target, with draft heads written at test time.

No trained head is at hand, so these prove the plumbing: with random heads (acceptance near 0)
the output must equal plain greedy decoding token for token, batched, with trees, after a
radix-cache hit; and a head constructed to copy the target (whose attention is switched off, so
each token's next one depends on that token alone) must get every draft token accepted.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from test_spec_verify import make_req, run  # noqa: E402

from engine.assembly import Assembly  # noqa: E402
from engine.config import ServerConfig  # noqa: E402
from engine.errors import ConfigError  # noqa: E402
from engine.runtime.model_runner import ModelRunner  # noqa: E402
from engine.runtime.scheduler import Scheduler  # noqa: E402

H, V, I = 64, 128, 96
PROMPTS = [[5, 17, 99, 3, 42, 7, 100, 31], [9, 8, 7], [50, 51, 2, 60, 61, 62, 63, 64, 65, 66,
                                                      12, 13, 14], [1, 2, 3, 4, 5, 6]]
STEPS = 16


def _save(path: str, tensors: dict[str, torch.Tensor], config: dict) -> str:
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def _rand(gen: torch.Generator, *shape: int, scale: float = 0.2) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def target_checkpoint(root: str, layers: int, attention: bool) -> tuple[str, dict]:
    gen = torch.Generator().manual_seed(1)
    t = {"model.embed_tokens.weight": _rand(gen, V, H, scale=1.0),
         "model.norm.weight": torch.ones(H), "lm_head.weight": _rand(gen, V, H, scale=1.0)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": _rand(gen, H, H),
                  p + "self_attn.k_proj.weight": _rand(gen, H // 2, H),
                  p + "self_attn.v_proj.weight": _rand(gen, H // 2, H),
                  p + "self_attn.o_proj.weight": _rand(gen, H, H) if attention
                  else torch.zeros(H, H),
                  p + "mlp.gate_proj.weight": _rand(gen, I, H),
                  p + "mlp.up_proj.weight": _rand(gen, I, H),
                  p + "mlp.down_proj.weight": _rand(gen, H, I),
                  p + "input_layernorm.weight": 1 + _rand(gen, H, scale=0.1),
                  p + "post_attention_layernorm.weight": 1 + _rand(gen, H, scale=0.1)})
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": layers, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": V,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "eos_token_id": None, "bos_token_id": None}
    return _save(os.path.join(root, "target"), t, cfg), t


def head_config(arch: str, **extra) -> dict:
    return {"architectures": [arch], "hidden_size": H, "intermediate_size": I,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": V, "rms_norm_eps": 1e-5, **extra}


def eagle_head(root: str, copy_of: dict | None = None, seed: int = 2) -> str:
    """An EAGLE head; ``copy_of`` (a target's tensors): fc passes the token's embedding, the
    layer's attention is off and its MLP is the target's layer 0 MLP."""
    gen = torch.Generator().manual_seed(seed)
    t = {"model.fc.weight": _rand(gen, H, 2 * H), "model.fc.bias": _rand(gen, H),
         "model.layers.0.self_attn.q_proj.weight": _rand(gen, H, H),
         "model.layers.0.self_attn.k_proj.weight": _rand(gen, H // 2, H),
         "model.layers.0.self_attn.v_proj.weight": _rand(gen, H // 2, H),
         "model.layers.0.self_attn.o_proj.weight": _rand(gen, H, H),
         "model.layers.0.mlp.gate_proj.weight": _rand(gen, I, H),
         "model.layers.0.mlp.up_proj.weight": _rand(gen, I, H),
         "model.layers.0.mlp.down_proj.weight": _rand(gen, H, I),
         "model.layers.0.post_attention_layernorm.weight": torch.ones(H)}
    name = "eagle"
    if copy_of is not None:
        name = "eagle-copy"
        t["model.fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], 1)
        t["model.fc.bias"] = torch.zeros(H)
        t["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(H, H)
        for k in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm"):
            t[f"model.layers.0.{k}.weight"] = copy_of[f"model.layers.0.{k}.weight"]
    return _save(os.path.join(root, name), t, head_config("LlamaForCausalLMEagle"))


def eagle3_head(root: str, draft_vocab: int = 32) -> str:
    gen = torch.Generator().manual_seed(3)
    t = {"fc.weight": _rand(gen, H, 3 * H), "norm.weight": torch.ones(H),
         "lm_head.weight": _rand(gen, draft_vocab, H, scale=1.0),
         "midlayer.input_layernorm.weight": torch.ones(H),
         "midlayer.hidden_norm.weight": torch.ones(H),
         "midlayer.post_attention_layernorm.weight": torch.ones(H),
         "midlayer.self_attn.q_proj.weight": _rand(gen, H, 2 * H),
         "midlayer.self_attn.k_proj.weight": _rand(gen, H // 2, 2 * H),
         "midlayer.self_attn.v_proj.weight": _rand(gen, H // 2, 2 * H),
         "midlayer.self_attn.o_proj.weight": _rand(gen, H, H),
         "midlayer.mlp.gate_proj.weight": _rand(gen, I, H),
         "midlayer.mlp.up_proj.weight": _rand(gen, I, H),
         "midlayer.mlp.down_proj.weight": _rand(gen, H, I),
         # draft id d is target id 4 * d (the map the head's logits go through)
         "d2t": torch.arange(draft_vocab) * 3, "t2d": torch.zeros(V, dtype=torch.bool)}
    return _save(os.path.join(root, "eagle3"), t,
                 head_config("LlamaForCausalLMEagle3", draft_vocab_size=draft_vocab))


def mtp_head(root: str) -> str:
    gen = torch.Generator().manual_seed(4)
    p = "model.layers.0."
    t = {p + "enorm.weight": torch.ones(H), p + "hnorm.weight": torch.ones(H),
         p + "eh_proj.weight": _rand(gen, H, 2 * H),
         p + "shared_head.norm.weight": torch.ones(H),
         p + "input_layernorm.weight": torch.ones(H),
         p + "post_attention_layernorm.weight": torch.ones(H),
         p + "self_attn.q_proj.weight": _rand(gen, H, H),
         p + "self_attn.k_proj.weight": _rand(gen, H // 2, H),
         p + "self_attn.v_proj.weight": _rand(gen, H // 2, H),
         p + "self_attn.o_proj.weight": _rand(gen, H, H),
         p + "mlp.gate_proj.weight": _rand(gen, I, H), p + "mlp.up_proj.weight": _rand(gen, I, H),
         p + "mlp.down_proj.weight": _rand(gen, H, I)}
    return _save(os.path.join(root, "mtp"), t, head_config("DeepseekV3ForCausalLMNextN"))


@pytest.fixture(scope="module")
def files():
    root = tempfile.mkdtemp(prefix="engine-eagle-")
    target, _ = target_checkpoint(root, layers=4, attention=True)
    bigram, bigram_t = target_checkpoint(os.path.join(root, "bigram"), layers=1,
                                         attention=False)
    return {"target": target, "bigram": bigram, "eagle": eagle_head(root),
            "copy": eagle_head(root, copy_of=bigram_t), "eagle3": eagle3_head(root),
            "mtp": mtp_head(root)}


def scheduler(model: str, **spec) -> Scheduler:
    config = ServerConfig(model_path=model, device="cpu", dtype="float32",
                          skip_tokenizer_init=True, attention_backend="torch_native",
                          max_total_tokens=2048, max_running_requests=8, **spec)
    assembly = Assembly(config)
    runner = ModelRunner(config, assembly)
    return Scheduler(config, runner, speculative=assembly.speculative(runner))


def generate(sched: Scheduler, prompts=PROMPTS, steps: int = STEPS) -> tuple[list, list]:
    outs: dict = {}
    reqs = [make_req(list(p), outs, max_new=steps) for p in prompts]
    got = run(sched, reqs, outs)
    return [got[r.rid][0] for r in reqs], [got[r.rid][1] for r in reqs]


@pytest.fixture(scope="module")
def reference(files):
    plain = scheduler(files["target"])
    return generate(plain)[0], generate(scheduler(files["bigram"]))[0]


@pytest.mark.parametrize("algo,head,topk", [("EAGLE", "eagle", 1), ("eagle", "eagle", 3),
                                            ("EAGLE3", "eagle3", 1), ("eagle3", "eagle3", 2),
                                            ("NEXTN", "mtp", 1), ("nextn", "eagle", 1)])
def test_random_heads_give_exactly_the_greedy_output(files, reference, algo, head, topk):
    steps, width = (3, 4) if topk == 1 else (3, 3 * topk + 1)
    sched = scheduler(files["target"], speculative_algorithm=algo,
                      speculative_draft_model_path=files[head], speculative_num_steps=steps,
                      speculative_eagle_topk=topk, speculative_num_draft_tokens=width)
    ids, last = generate(sched)
    assert ids == reference[0]
    assert all(out.spec_verify_ct > 0 for out in last)
    again, _ = generate(sched, PROMPTS[:2])  # prefix hits: the cached tokens keep features
    assert again == reference[0][:2]
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens


def test_a_head_that_copies_the_target_has_every_draft_accepted(files, reference):
    sched = scheduler(files["bigram"], speculative_algorithm="eagle",
                      speculative_draft_model_path=files["copy"])
    ids, last = generate(sched)
    assert ids == reference[1]
    for out in last:  # (3, 1, 4): 3 drafts per verify, all accepted
        verified = out.completion_tokens - 1
        assert out.spec_accepted_tokens + out.spec_verify_ct == verified
        assert out.spec_verify_ct == -(-verified // 4)


def test_eagle3_maps_draft_ids_to_target_ids_with_d2t(files):
    from engine.runtime.speculative import TargetView
    from engine_spec_eagle.model import load_head

    runner = scheduler(files["target"]).runner
    head = load_head(files["eagle3"], TargetView(runner), want="eagle3")
    assert head.cfg.vocab_size == 32 and head.cfg.aux_layers == [2, 2, 1]
    assert head.d2t.tolist() == (torch.arange(32) * 3).tolist()
    from engine_spec_eagle.impl import EagleProposer
    from engine.api.speculative import SpecContext

    p = EagleProposer(head, SpecContext(target=TargetView(runner)), 1, 2, 3)
    with torch.no_grad():
        hidden = torch.randn(1, H)
        draft_ids = head.lm_head(head.head_input(hidden)).topk(2).indices[0].tolist()
        assert p._pick(hidden) == [d * 4 for d in draft_ids]


def test_eagle_without_a_head_or_with_the_wrong_layout_is_refused(files):
    with pytest.raises(ConfigError, match="needs a draft head"):
        scheduler(files["target"], speculative_algorithm="eagle")
    with pytest.raises(ConfigError, match="an EAGLE-3 head; use --speculative-algorithm EAGLE3"):
        scheduler(files["target"], speculative_algorithm="eagle",
                  speculative_draft_model_path=files["eagle3"])


def test_eagle2_rerank_keeps_the_best_cumulative_scores_closed_under_ancestors():
    from engine_spec_eagle.impl import rerank

    # root children a (-0.1), b (-1.0); a's children c (-0.3), d (-2.5); b's child e (-1.2);
    # c's child f (-0.35): cumulative scores along each path
    tokens = [10, 11, 12, 13, 14, 15]
    parents = [-1, -1, 0, 0, 1, 2]
    scores = [-0.1, -1.0, -0.3, -2.5, -1.2, -0.35]
    depths = [1, 1, 2, 2, 2, 3]
    d = rerank(tokens, parents, scores, depths, 4)
    # best four: a, c, f, b; in depth order with parents first
    assert d.token_ids == [10, 11, 12, 15] and d.parents == [-1, -1, 0, 2]
    d = rerank(tokens, parents, scores, depths, 2)
    assert d.token_ids == [10, 12] and d.parents == [-1, 0]
    # a tie between a parent and its child (a child's log-probability of 0) keeps the parent
    d = rerank([1, 2], [-1, 0], [-0.5, -0.5], [1, 2], 1)
    assert d.token_ids == [1] and d.parents == [-1]
    assert rerank(tokens, parents, scores, depths, 0).token_ids == []


def test_an_eagle2_tree_from_a_head_that_copies_the_target_is_lossless_and_accepted(files,
                                                                                  reference):
    """With top-2 and a width beyond a chain the head grows an EAGLE-2 tree; the head copies
    the target, so its best candidate at depth 1 (the highest score of all) is the target's own
    next token: every verify accepts at least one draft, and the output is the greedy one."""
    sched = scheduler(files["bigram"], speculative_algorithm="eagle",
                      speculative_draft_model_path=files["copy"], speculative_num_steps=3,
                      speculative_eagle_topk=2, speculative_num_draft_tokens=6)
    assert sched.spec.proposer.drafts_trees
    ids, last = generate(sched)
    assert ids == reference[1]
    for out in last:
        assert out.spec_accepted_tokens >= out.spec_verify_ct - 1


@pytest.mark.parametrize("topk", [1, 3])
def test_verify_rows_padded_for_a_captured_graph_give_the_same_output(files, reference, topk):
    """Verify rows padded to the width, as the verify step pads them when a captured graph
    will replay the forward (padding nodes write the reserved slot 0 and are seen by no real
    node), leave the greedy output as it is on the real model (torch_native, CPU)."""
    steps, width = (3, 4) if topk == 1 else (3, 3 * topk + 1)
    sched = scheduler(files["target"], speculative_algorithm="eagle",
                      speculative_draft_model_path=files["eagle"], speculative_num_steps=steps,
                      speculative_eagle_topk=topk, speculative_num_draft_tokens=width)
    sched.runner.verify_graph_width = lambda batch_size, longest: width
    seen = []
    forward = sched.runner.forward
    sched.runner.forward = lambda b: seen.append((b.mode.value, b.extend_lens_cpu)) or \
        forward(b)
    ids, _ = generate(sched)
    assert ids == reference[0]
    verify = [ext for mode, ext in seen if mode == "verify"]
    assert verify and all(set(ext) == {width} for ext in verify)
    sched.cache.flush()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens


@pytest.mark.parametrize("algo,head,topk,width", [
    ("EAGLE", "eagle", 1, 4), ("EAGLE3", "eagle3", 2, 4), ("NEXTN", "mtp", 1, 4),
    ("EAGLE", "eagle", 3, 8), ("EAGLE3", "eagle3", 2, 6)])
def test_batched_drafting_drafts_what_each_request_alone_drafts(files, reference, algo, head,
                                                                 topk, width):
    """Every request drafts in one batched forward per step over the row cache (chains, and
    EAGLE-2 trees whose frontier expands for all requests at once); the drafts equal those of
    the per-request head on its own contiguous cache (after verifies, prefix hits and requests
    leaving)."""
    sched = scheduler(files["target"], speculative_algorithm=algo,
                      speculative_draft_model_path=files[head], speculative_num_steps=3,
                      speculative_eagle_topk=topk, speculative_num_draft_tokens=width)
    proposer = sched.spec.proposer
    assert proposer.drafts_trees == (width > 4)
    batched = proposer.propose
    compared = []

    def both(requests):
        got = batched(requests)
        alone = [proposer._propose(req) for req in requests]
        assert [(d.token_ids, d.parents) for d in got] == \
            [(d.token_ids, d.parents) for d in alone]
        compared.append(len(requests))
        return got

    proposer.propose = both
    ids, _ = generate(sched)
    assert ids == reference[0]
    again, _ = generate(sched, PROMPTS[:2])
    assert again == reference[0][:2]
    assert len(compared) > 5 and max(compared) == len(PROMPTS)


def test_the_row_cache_grows_with_requests_and_lengths_keeping_what_it_holds(files,
                                                                              monkeypatch):
    """One row of 16 positions to start with: more requests and longer sequences reallocate it
    (contents kept, the version moves on) and the output stays plain greedy decoding's."""
    import engine_spec_eagle.impl as impl
    from engine.api.speculative import RowCache

    monkeypatch.setattr(impl, "MIN_SPAN", 16)
    long_prompts = [p * 6 for p in PROMPTS]  # up to 78 tokens: spans of 16 .. 128
    plain = generate(scheduler(files["target"]), long_prompts)[0]
    sched = scheduler(files["target"], speculative_algorithm="EAGLE",
                      speculative_draft_model_path=files["eagle"])
    proposer = sched.spec.proposer
    c = proposer.head.cfg
    proposer.rows = RowCache(c.num_layers, c.num_kv_heads, c.head_dim, proposer.device,
                             proposer.dtype, rows=1, cap=16)
    ids, _ = generate(sched, long_prompts)
    assert ids == plain
    assert proposer.rows.rows >= len(PROMPTS) and proposer.rows.cap >= 64
    assert proposer.rows.version >= 4
    cache = RowCache(1, 2, 16, proposer.device, proposer.dtype, rows=2, cap=4)
    cache.k[0][1, 3] = 7.0
    cache.grow(5, 9)
    assert (cache.rows, cache.cap) == (8, 16) and cache.k[0][1, 3].eq(7.0).all()
    assert cache.k[0].shape[0] == 9  # the scratch row last


def test_token_slices_span_the_prompt_and_the_output():
    from types import SimpleNamespace

    from engine_spec_eagle.impl import token_slice

    req = SimpleNamespace(origin_input_ids=[1, 2, 3, 4], output_ids=[5, 6, 7])
    whole = req.origin_input_ids + req.output_ids
    for a in range(len(whole) + 1):
        for b in range(a, len(whole) + 1):
            assert token_slice(req, a, b) == whole[a:b]
