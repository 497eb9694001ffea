"""DSPARK (static mode): a DSpark draft drafts a block per request per step, verified as a
chain. The per-request context cache and the backbone are DFLASH's; the drafts go through the
Markov head (``model``)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.api import ConfigError, hookimpl
from engine.api.speculative import Proposer, SpecContext

from engine_spec_dflash.impl import DFlashProposer
from engine_spec_dflash.model import config_from_raw, load_head, read_raw
from engine_spec_dspark.model import HEAD_TYPES, DSparkHead, markov_settings, normalized

log = logging.getLogger("engine.speculative")


class DSparkProposer(DFlashProposer):
    def describe(self) -> str:
        c, m = self.head.cfg, self.head.markov_head
        return (f"DSpark draft ({c.num_layers} layers over target layers "
                f"{c.target_layer_ids}, {m.kind} Markov head of rank {m.rank}), "
                f"{self.num_draft_tokens - 1} drafts per block, static verify")

    def draft_tokens(self, hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        b, g, h = hidden.shape
        base = self.target.logits(hidden.reshape(-1, h)).view(b, g, -1)
        return self.head.markov_head.greedy(base, last, hidden)


def build(config: Any, context: SpecContext, options: Any) -> DSparkProposer:
    target = context.target
    if target is None:
        raise ConfigError("this server cannot give a DSpark draft the target's features")
    path = config.speculative_draft_model_path
    if not path:
        raise ConfigError("DSPARK needs a DSpark draft: set --speculative-draft-model-path")
    if context.eagle_topk not in (None, 1) or context.num_steps not in (None, 1):
        log.info("DSPARK drafts one block per step, verified as a chain: "
                 "--speculative-num-steps and --speculative-eagle-topk are taken as 1")
    raw = normalized(read_raw(path))
    kind, rank = markov_settings(raw)
    where = f"--speculative-draft-model-path {path}"
    if rank < 1:
        raise ConfigError(f"{where}: markov_rank {rank}; a DSpark draft needs its Markov head "
                          "(markov_rank > 0)")
    if kind not in HEAD_TYPES:
        raise ConfigError(f"{where}: markov_head_type {kind!r} is not built (one of "
                          f"{', '.join(HEAD_TYPES)})")
    vocab = int(raw.get("draft_vocab_size") or raw.get("vocab_size") or target.vocab_size)
    if vocab != target.vocab_size:
        raise ConfigError(f"{where}: the Markov head's vocabulary has {vocab} tokens, the "
                          f"target's {target.vocab_size}")
    cfg = config_from_raw(raw, path, target)
    head = DSparkHead(cfg, kind, rank, vocab)
    head = load_head(path, target, dummy=config.speculative_draft_load_format == "dummy",
                     seed=config.random_seed or 0, head=head, skip=("confidence_head.",))
    head = head.to(device=target.device, dtype=target.dtype).eval()
    gamma = options["speculative_dspark_block_size"]
    if gamma and context.num_draft_tokens and int(gamma) + 1 != context.num_draft_tokens:
        raise ConfigError(f"--speculative-dspark-block-size {gamma} and "
                          f"--speculative-num-draft-tokens {context.num_draft_tokens} differ "
                          "(the verify window is the block size + 1)")
    gamma = int(gamma or (context.num_draft_tokens - 1 if context.num_draft_tokens
                          else cfg.block_size))
    if gamma < 1:
        raise ConfigError(f"DSPARK block size {gamma}: at least 1 draft token")
    if kind == "carh" and gamma > cfg.block_size:
        raise ConfigError(f"DSPARK block size {gamma}: a carh Markov head has depth "
                          f"embeddings for {cfg.block_size} positions only")
    graphs = target.device.type == "cuda" and not config.disable_cuda_graph
    return DSparkProposer(head, context, gamma + 1, graphs=graphs)


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, options)
