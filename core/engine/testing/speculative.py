"""Conformance kit of the speculative family: a proposer's drafts are well-formed.

``check(name, build)`` builds the proposer through its hook (``build(model_config=...,
config=..., context=...)``) with a :class:`~engine.api.speculative.SpecContext` whose draft
model is a small stand-in (deterministic logits from the last token, the target's vocabulary)
and runs a few rounds of drafting over requests with repetitive and random token streams,
appending tokens between rounds as the verify step would

(a draft-model proposer gets ``--speculative-draft-model-path`` of a tiny random model:
``--speculative-draft-load-format dummy``, and a two-layer stand-in target whose features are
its token embeddings; a proposer that refuses a draft model, drafting with the target alone
(UNO), is built again with the width only and random draft weights, and its target's
``run_block`` is the stand-in's). It checks:

* the product is a :class:`~engine.api.speculative.Proposer` with a verify width of at least 2;
* one :class:`~engine.api.speculative.Draft` per request, of at most width - 1 nodes, whose
  parents point to earlier nodes (or -1), whose siblings carry distinct tokens, within the
  vocabulary; chains only unless ``drafts_trees``;
* ``release`` of a request (twice) and drafting again for it afterwards both work.

Losslessness is the core's (the verify step); it is tested in the engine's own test suite.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch

from engine.api.speculative import Draft, DraftModel, Proposer, SpecContext, TargetModel
from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.models.config import ModelConfig

VOCAB = 64
HIDDEN = 16


class StandInDraftModel(DraftModel):
    """Logits peaked at ``(last token * 7 + 3) % vocab``; tracks lengths like the real one."""

    def __init__(self, vocab: int = VOCAB) -> None:
        self.vocab_size = vocab
        self._len: dict[Hashable, int] = {}

    def extend(self, items: Sequence[tuple[Hashable, int, Sequence[int]]]) -> torch.Tensor:
        out = torch.zeros(len(items), self.vocab_size)
        for i, (key, start, tokens) in enumerate(items):
            if start > self._len.get(key, 0) or not tokens:
                raise ValueError(f"extend at {start} of a sequence of {self._len.get(key, 0)}")
            self._len[key] = start + len(tokens)
            out[i, (tokens[-1] * 7 + 3) % self.vocab_size] = 5.0
            out[i, (tokens[-1] * 5 + 1) % self.vocab_size] = 4.0
        return out

    def length(self, key: Hashable) -> int:
        return self._len.get(key, 0)

    def release(self, key: Hashable) -> None:
        self._len.pop(key, None)


class StandInTarget(TargetModel):
    """A two-layer target's parts: an embedding table as embeddings, head and features."""

    def __init__(self) -> None:
        self.hidden_size, self.vocab_size, self.num_layers = HIDDEN, VOCAB, 2
        self.dtype, self.device, self.rms_norm_eps = torch.float32, torch.device("cpu"), 1e-5
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(VOCAB, HIDDEN, generator=gen)
        self.width = 0

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.table[token_ids]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float() @ self.table.T

    def capture(self, layers: Sequence[int] = ()) -> int:
        self.width = HIDDEN * max(1, len(layers))
        return self.width

    def features(self, request: Any, start: int, end: int) -> torch.Tensor:
        if not self.width:
            raise RuntimeError("features read before capture()")
        if not 0 <= start <= end <= request.kv_len:
            raise ValueError(f"features of {start}..{end} with {request.kv_len} in the KV")
        ids = torch.tensor((request.origin_input_ids + request.output_ids)[start:end])
        return self.table[ids].repeat(1, self.width // HIDDEN)


    def adapter(self, path: str | None, *, rank: int = 8, seed: int = 0) -> Any:
        if path is not None:
            raise ValueError("the stand-in target has random adapters only")
        gen = torch.Generator().manual_seed(seed)
        return _StandInAdapter(torch.randn(HIDDEN, HIDDEN, generator=gen) * 0.5, rank)

    def run_block(self, requests: Sequence[Any], blocks: Sequence[Sequence[int]], *,
                  adapter: Any = None, plain_rows: int = 0) -> list[Any]:
        if len(blocks) != len(requests):
            raise ValueError(f"{len(blocks)} blocks for {len(requests)} requests")
        out = []
        for req, block in zip(requests, blocks):
            if req.kv_len < 0 or not block:
                out.append(None)
                continue
            h = self.table[torch.tensor(list(block))]
            if adapter is not None:
                h = torch.cat([h[:plain_rows], h[plain_rows:] @ adapter.mix])
            out.append(self.logits(h))
        return out


@dataclass
class _StandInAdapter:
    mix: torch.Tensor
    rank: int
    path: str = "(random)"


@dataclass(eq=False)
class FakeRequest:
    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)

    @property
    def kv_len(self) -> int:  # every token but the last is in the target's KV
        return len(self.origin_input_ids) + len(self.output_ids) - 1


def draft_head_dir() -> str:
    """A directory with a tiny draft model's config.json (random weights: load format dummy)."""
    import json
    import tempfile

    path = tempfile.mkdtemp(prefix="engine-spec-kit-")
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": 32,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 8, "vocab_size": VOCAB, "max_position_embeddings": 512,
           # what a block-draft head (DFLASH) reads besides: the stand-in target's two layers
           # (and a DSpark draft's Markov head)
           "block_size": 4, "dflash_config": {"target_layer_ids": [0, 1],
                                              "mask_token_id": VOCAB - 1, "markov_rank": 4,
                                              "markov_head_type": "gated"}}
    with open(f"{path}/config.json", "w") as f:
        json.dump(cfg, f)
    return path


def model_config() -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", hidden_size=HIDDEN, intermediate_size=32,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=8, vocab_size=VOCAB, max_position_embeddings=512)


def draft_failures(draft: Any, proposer: Proposer) -> list[str]:
    if not isinstance(draft, Draft):
        return [f"drafted a {type(draft).__name__}, not a Draft"]
    errs = []
    if len(draft.token_ids) != len(draft.parents):
        errs.append("token_ids and parents differ in length")
    if len(draft) > proposer.num_draft_tokens - 1:
        errs.append(f"{len(draft)} nodes for a verify width of {proposer.num_draft_tokens}")
    seen: set[tuple[int, int]] = set()
    for i, (tok, par) in enumerate(zip(draft.token_ids, draft.parents)):
        if not -1 <= par < i:
            errs.append(f"node {i}: parent {par} is not an earlier node")
        if (par, tok) in seen:
            errs.append(f"node {i}: a sibling already carries token {tok}")
        seen.add((par, tok))
        if not 0 <= tok < VOCAB:
            errs.append(f"node {i}: token {tok} outside the vocabulary")
    if not proposer.drafts_trees and not draft.is_chain:
        errs.append("a tree from a proposer that declares chains only (drafts_trees False)")
    return errs


def check(name: str, build: Callable[..., Any]) -> list[str]:
    context = SpecContext(num_steps=3, eagle_topk=2, num_draft_tokens=6,
                          device=torch.device("cpu"), target=StandInTarget(),
                          draft_loader=StandInDraftModel)
    config = ServerConfig(speculative_draft_model_path=draft_head_dir(),
                          speculative_draft_load_format="dummy")
    try:
        proposer = build(model_config=model_config(), config=config, context=context)
    except ConfigError as first:
        # a proposer that drafts with the target alone (UNO) refuses a draft model and
        # tree settings: build it again with the width only, random draft weights
        context = SpecContext(num_draft_tokens=6, device=torch.device("cpu"),
                              target=StandInTarget(), draft_loader=StandInDraftModel)
        config = ServerConfig(speculative_draft_load_format="dummy")
        try:
            proposer = build(model_config=model_config(), config=config, context=context)
        except ConfigError as second:
            return [f"refused with a draft model ({first}) and without one ({second})"]
    if not isinstance(proposer, Proposer):
        return [f"the hook returned {type(proposer).__name__}, not a Proposer"]
    if proposer.num_draft_tokens < 2:
        return [f"verify width {proposer.num_draft_tokens}: at least 2 (one draft token)"]
    rng = random.Random(0)
    phrase = [rng.randrange(VOCAB) for _ in range(9)]
    reqs = [FakeRequest("repeat", phrase * 4), FakeRequest("random",
                                                           [rng.randrange(VOCAB) for _ in range(30)]),
            FakeRequest("short", [1], [2])]
    failures: list[str] = []
    for rnd in range(6):
        drafts = proposer.propose(reqs)
        if len(drafts) != len(reqs):
            return [f"round {rnd}: {len(drafts)} drafts for {len(reqs)} requests"]
        for req, draft in zip(reqs, drafts):
            failures += [f"round {rnd} {req.rid}: {e}" for e in draft_failures(draft, proposer)]
            # accept the first node when there is one, else a token of the stream
            nxt = draft.token_ids[:1] if draft else [phrase[len(req.output_ids) % len(phrase)]]
            proposer.on_verified(req, len(nxt) if draft else 0)
            req.output_ids += nxt + [phrase[(len(req.output_ids) + 1) % len(phrase)]]
        if rnd == 3:
            proposer.release(reqs[0])
            proposer.release(reqs[0])
    for req in reqs:
        proposer.release(req)
    return failures
