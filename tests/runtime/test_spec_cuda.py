"""Speculative verify on a GPU (skipped without CUDA): a small Llama with dummy float32 weights
behind the triton backend. Verify forwards replay captured CUDA graphs (rows padded to the
verify width, batch sizes padded to a bucket); the greedy tokens must equal plain decoding's and
the eager verify's, for chains and trees with accepted and rejected nodes, requests joining
while others verify, and the KV memory must come back whole."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Sequence

import pytest
import torch

from engine.api.speculative import Draft, Proposer
from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.runtime.request import Req, ReqOutput
from engine.runtime.sampling import SamplingParams
from engine.runtime.scheduler import Scheduler
from engine.runtime.speculative import SpecDecoder

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

sys.path.insert(0, os.path.dirname(__file__))

from test_sched_overlap_cuda import CONFIG  # noqa: E402  (the same small Llama)

WIDTH = 6


class Known(Proposer):
    """Drafts from the known greedy continuation: ``good`` right tokens then a wrong one, with
    a wrong sibling under the root when ``tree``; chains of 4, 1 and 3 nodes in turn, and every
    fourth step nothing."""

    def __init__(self, truth: dict[tuple[int, ...], list[int]], good: int, tree: bool) -> None:
        self.truth, self.good, self.drafts_trees = truth, good, tree
        self.num_draft_tokens = WIDTH
        self.calls = 0

    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        self.calls += 1
        out = []
        for req in requests:
            full = self.truth[tuple(req.origin_input_ids)]
            done = len(req.output_ids)
            nxt = full[done:done + self.good] + [(full[done + self.good] + 1) % 512
                                                 if done + self.good < len(full) else 7]
            length = (0, WIDTH - 2, 1, 3)[self.calls % 4]  # rows of every captured width
            if not length:
                out.append(Draft())
                continue
            draft = Draft.chain(nxt[:length])
            if self.drafts_trees:
                draft = Draft([(nxt[0] + 3) % 512] + draft.token_ids,
                              [-1] + [p + 1 if p >= 0 else -1 for p in draft.parents])
            out.append(draft)
        return out

    def on_verified(self, request: Any, accepted: int) -> None:
        pass

    def release(self, request: Any) -> None:
        pass


class Detok:
    def add(self, t: int) -> str:
        return ""

    def finish(self) -> str:
        return ""


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(CONFIG))
    return str(path)


def make_runner(path: str, graphs: bool) -> ModelRunner:
    torch.manual_seed(0)  # the same dummy weights for every runner
    return ModelRunner(ServerConfig(model_path=path, load_format="dummy", device="cuda",
                                    dtype="float32", skip_tokenizer_init=True,
                                    attention_backend="triton", page_size=16,
                                    context_length=512, max_running_requests=16,
                                    max_total_tokens=8192,
                                    disable_cuda_graph=not graphs))


def generate(sched: Scheduler, prompts: list[list[int]], max_new: int) -> dict[tuple, list]:
    outs: dict[str, list[ReqOutput]] = {}
    reqs = []
    for k, p in enumerate(prompts):
        rid = f"r{k}"
        outs[rid] = []
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new,
                                ignore_eos=True).validate()
        reqs.append(Req(rid=rid, origin_input_ids=p, sampling_params=params,
                        sink=outs[rid].append, detokenizer=Detok(), max_new_tokens=max_new,
                        stop_ids=frozenset()))
    sched.submit(reqs[: len(reqs) // 2])
    for step in range(2000):
        if step == 3:
            sched.submit(reqs[len(reqs) // 2:])  # joining while the others verify
        if not sched.step() and step > 3:
            break
    sched.flush_cache()
    sched.step()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens
    result = {}
    for req in reqs:
        assert outs[req.rid][-1].finished
        result[tuple(req.origin_input_ids)] = [t for c in outs[req.rid] for t in c.token_ids]
    return result


@pytest.mark.parametrize("good,tree", [(2, False), (4, False), (1, True)])
def test_verify_graphs_give_plain_greedy_tokens(path, good, tree) -> None:
    prompts = [[(7 * i + 3 * j) % 500 + 3 for j in range(20 + 9 * i)] for i in range(5)]
    graphs = make_runner(path, graphs=True)
    plain = generate(Scheduler(graphs.config, graphs), prompts, 24)
    for runner in (graphs, make_runner(path, graphs=False)):
        proposer = Known(plain, good, tree)
        spec = SpecDecoder(proposer, runner)
        replays = []
        for verify in runner.verify_graphs:
            def counted(b, s, run=verify.run, w=verify.width):
                replays.append((w, s))
                return run(b, s)
            verify.run = counted
        got = generate(Scheduler(runner.config, runner, speculative=spec), prompts, 24)
        assert got == plain
        assert spec.stats.accepted_tokens > 0
        if good < WIDTH - 2:
            assert spec.stats.draft_tokens > spec.stats.accepted_tokens
        if runner is graphs:
            widths = [v.width for v in runner.verify_graphs]
            assert widths == [2, 4, WIDTH] and replays
            assert min(w for w, _ in replays) < WIDTH  # narrower rows use narrower graphs
        else:
            assert runner.verify_graphs == []


def test_standalone_drafts_replay_the_draft_models_decode_graphs(path) -> None:
    """STANDALONE with the target's own weights as the draft: the draft model's one-token
    steps replay its decode CUDA graphs, the target verifies from its verify graphs, nearly
    every draft token is accepted and the output is plain greedy decoding's."""
    from engine.assembly import Assembly

    prompts = [[(5 * i + 11 * j) % 500 + 3 for j in range(30 + 7 * i)] for i in range(4)]
    target = make_runner(path, graphs=True)
    plain = generate(Scheduler(target.config, target), prompts, 20)
    cfg = target.config.replace(speculative_algorithm="STANDALONE",
                                speculative_draft_model_path=path, speculative_num_steps=3,
                                speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    spec = Assembly(cfg).speculative(target)
    draft = spec.proposer.draft.runner
    assert draft.decode_graphs is not None and target.verify_graphs
    replays = []
    run = draft.decode_graphs.run
    draft.decode_graphs.run = lambda b, *size: replays.append(b.batch_size) or run(b, *size)
    got = generate(Scheduler(cfg, target, speculative=spec), prompts, 20)
    assert got == plain and replays
    assert spec.stats.accepted_tokens >= 0.9 * spec.stats.draft_tokens


def compare_graph_drafts(proposer) -> list[int]:
    """Make ``proposer`` (a head over a row cache with graphs) draft every step twice from
    the same state: from its graphs, then eagerly; the drafts must be the same. Returns the
    list the batch sizes compared go into."""
    real, compared = proposer.propose, []
    graphs = (proposer.graphs, getattr(proposer, "tree_graphs", None))

    def both(requests):
        fed = dict(proposer.rows.fed)
        got = real(requests)
        for r in proposer.rows.fed:  # as before (a new request's row: nothing yet)
            proposer.rows.fed[r] = fed.get(r, 0)
        proposer.graphs = proposer.tree_graphs = None
        eager = real(requests)
        proposer.graphs, proposer.tree_graphs = graphs
        assert [(d.token_ids, d.parents) for d in got] == \
            [(d.token_ids, d.parents) for d in eager]
        compared.append(len(requests))
        return got

    proposer.propose = both
    return compared


@pytest.mark.parametrize("algo", ["UNO", "DSPARK", "DFLASH"])
def test_drafts_from_the_target_run_on_the_gpu_and_are_lossless(path, tmp_path, algo) -> None:
    """UNO (the target with a random LoRA adapter drafts in one forward, into the slots its
    verify then rewrites), DSPARK and DFLASH (random block drafts over the target's features)
    on CUDA: plain greedy output, verify graphs replayed, KV memory back whole; the drafts
    from graphs (UNO's draft block, the heads' blocks) equal the same forwards run eagerly;
    UNO's adapter-free first row is accepted in every verify that was not cut short."""
    from engine.assembly import Assembly

    prompts = [[(3 * i + 13 * j) % 500 + 3 for j in range(25 + 6 * i)] for i in range(4)]
    target = make_runner(path, graphs=True)
    plain = generate(Scheduler(target.config, target), prompts, 20)
    draft = None
    if algo != "UNO":
        draft = tmp_path / "draft"
        draft.mkdir()
        cfg = {"architectures": [f"{algo.capitalize()}DraftModel"], "model_type": "qwen3",
               "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
               "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "block_size": 4, "vocab_size": 512,
               "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 5,
                                 "markov_rank": 8, "markov_head_type": "rnn"}}
        (draft / "config.json").write_text(json.dumps(cfg))
    cfg = target.config.replace(speculative_algorithm=algo, speculative_num_draft_tokens=4,
                                speculative_draft_model_path=str(draft) if draft else None,
                                speculative_draft_load_format="dummy")
    spec = Assembly(cfg).speculative(target)
    replays = []
    for verify in target.verify_graphs:
        def counted(b, s, run=verify.run):
            replays.append(s)
            return run(b, s)
        verify.run = counted
    proposer, same = spec.proposer, []
    if algo == "UNO":  # the draft block replays its own graphs: the same drafts as eagerly
        real = proposer.propose

        def both(requests):
            state = proposer._gen.get_state()  # the same noise tokens for both
            got = real(requests)
            proposer._gen.set_state(state)
            saved = dict(target._block_graphs)
            target._block_graphs.update({k: (None, a) for k, (_, a) in saved.items()})
            eager = real(requests)
            target._block_graphs.update(saved)
            for d, e in zip(got, eager):
                same.extend(x == y for x, y in zip(d.token_ids, e.token_ids))
            return got

        proposer.propose = both
    else:  # the heads' blocks replay their own graphs: the same drafts as eagerly
        compared = compare_graph_drafts(proposer)
    got = generate(Scheduler(cfg, target, speculative=spec), prompts, 20)
    assert got == plain and replays
    if algo != "UNO":
        assert compared and proposer.graphs.replays > 0
    stats = spec.stats
    if algo == "UNO":
        assert stats.accepted_tokens >= stats.verified_requests - len(prompts)
        assert [g for g, _ in target._block_graphs.values()] != [None]
        assert len(same) > 50 and sum(same) >= 0.95 * len(same)


@pytest.mark.parametrize("algo,topk", [("EAGLE", 1), ("EAGLE3", 2), ("NEXTN", 1),
                                       ("EAGLE", 3)])
def test_eagle_heads_draft_in_captured_graphs_and_are_lossless(path, tmp_path, algo,
                                                               topk) -> None:
    """Random EAGLE-family heads on CUDA: chains (with sibling leaves at top-k 2) and EAGLE-2
    trees (top-k 3, width 7) draft every request at once, replaying captured graphs (the
    catch-up, then each step or frontier expansion); the graphs draft what the same forwards
    draft eagerly. Plain greedy output, KV memory back whole."""
    from engine.assembly import Assembly

    prompts = [[(11 * i + 7 * j) % 500 + 3 for j in range(20 + 9 * i)] for i in range(5)]
    target = make_runner(path, graphs=True)
    plain = generate(Scheduler(target.config, target), prompts, 20)
    head = tmp_path / "head"
    head.mkdir()
    arch = {"EAGLE": "LlamaForCausalLMEagle", "EAGLE3": "LlamaForCausalLMEagle3",
            "NEXTN": "DeepseekV3ForCausalLMNextN"}[algo]
    (head / "config.json").write_text(json.dumps(
        {"architectures": [arch], "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "vocab_size": 512, "draft_vocab_size": 512, "rms_norm_eps": 1e-5,
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 1]}}))
    width = 4 if topk < 3 else 7
    cfg = target.config.replace(speculative_algorithm=algo, speculative_draft_model_path=str(head),
                                speculative_draft_load_format="dummy", speculative_num_steps=3,
                                speculative_eagle_topk=topk, speculative_num_draft_tokens=width)
    spec = Assembly(cfg).speculative(target)
    proposer = spec.proposer
    compared = compare_graph_drafts(proposer)  # graphs draft what the forwards draft eagerly
    got = generate(Scheduler(cfg, target, speculative=spec), prompts, 20)
    assert got == plain
    assert compared and proposer.graphs.replays > 0
    if proposer.drafts_trees:  # the frontier's expansions replay graphs of their own
        assert proposer.tree_graphs.replays > 0
    else:
        assert len(proposer.graphs.graphs) >= 3  # catch-up and steps, per batch bucket
