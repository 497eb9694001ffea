"""DFLASH: a DFlash head (``model``) drafts a block per request per step, verified as a chain.

Per request the head keeps its context keys and values for the verified tokens it has read
(``fed``); each step it takes in the target's features of the tokens verified since, then runs
the block of the last token and ``width - 1`` mask tokens. A request whose verified length went
back (a retraction) starts over.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from engine.api import ConfigError, hookimpl
from engine.api.speculative import Draft, HeadCache, Proposer, SpecContext

from engine_spec_dflash.model import DFlashHead, load_head

log = logging.getLogger("engine.speculative")


class DFlashProposer(Proposer):
    drafts_trees = False

    def __init__(self, head: DFlashHead, context: SpecContext, width: int) -> None:
        self.head = head
        self.target = context.target
        self.num_draft_tokens = width
        self.device, self.dtype = self.target.device, self.target.dtype
        ids = head.cfg.target_layer_ids
        # the core keeps layer inputs, in layer order: layer L's output is layer L + 1's input
        # (past the last layer, the final normed state)
        self.target.capture(sorted(i + 1 for i in ids))
        order = sorted(range(len(ids)), key=lambda k: ids[k])
        h = head.cfg.hidden_size
        perm = [order.index(k) for k in range(len(ids))]  # checkpoint order from layer order
        self._perm = None if perm == list(range(len(ids))) else torch.cat(
            [torch.arange(p * h, (p + 1) * h) for p in perm]).to(self.device)
        self._seqs: dict[Any, HeadCache] = {}

    def describe(self) -> str:
        c = self.head.cfg
        return (f"DFlash head ({c.num_layers} layers over target layers {c.target_layer_ids}), "
                f"blocks of {self.num_draft_tokens}")

    def release(self, request: Any) -> None:
        self._seqs.pop(request, None)

    @torch.inference_mode()
    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        return [self._propose(req) for req in requests]

    def _propose(self, req: Any) -> Draft:
        kv = req.kv_len
        if kv < 1:
            return Draft()
        seq = self._seqs.get(req)
        if seq is None or seq.fed > kv:
            seq = self._seqs[req] = HeadCache(len(self.head.layers), self.device, self.dtype)
        c, width = self.head.cfg, self.num_draft_tokens
        feats = self.target.features(req, seq.fed, kv)
        if self._perm is not None:
            feats = feats.index_select(1, self._perm)
        last = req.output_ids[-1] if req.output_ids else req.origin_input_ids[-1]
        block = torch.tensor([last] + [c.mask_token_id] * (width - 1), device=self.device)
        emb = self.target.embed(block)
        if c.input_embedding_scale != 1.0:
            emb = emb * c.input_embedding_scale
        hidden = self.head(emb, feats, torch.arange(seq.fed, kv, device=self.device),
                           torch.arange(kv, kv + width, device=self.device), seq.caches)
        seq.fed = kv
        return Draft.chain(self.draft_tokens(hidden[1:], last))

    def draft_tokens(self, hidden: torch.Tensor, last: int) -> list[int]:
        """The drafts from the block's rows after the last token: the target's head, greedy
        (a variant may correct each row's logits by the tokens drafted before it)."""
        return self.target.logits(hidden).argmax(-1).tolist()


def build(config: Any, context: SpecContext, options: Any) -> DFlashProposer:
    target = context.target
    if target is None:
        raise ConfigError("this server cannot give a DFlash head the target's features")
    if context.eagle_topk not in (None, 1) or context.num_steps not in (None, 1):
        log.info("DFLASH drafts one block per step, verified as a chain: "
                 "--speculative-num-steps and --speculative-eagle-topk are taken as 1")
    fmt = config.speculative_draft_load_format
    head = load_head(config.speculative_draft_model_path, target, dummy=fmt == "dummy",
                     seed=config.random_seed)
    head = head.to(device=target.device, dtype=target.dtype).eval()
    block = options["speculative_dflash_block_size"]
    width = int(block or context.num_draft_tokens or head.cfg.block_size)
    if block and context.num_draft_tokens and int(block) != context.num_draft_tokens:
        raise ConfigError(f"--speculative-dflash-block-size {block} and "
                          f"--speculative-num-draft-tokens {context.num_draft_tokens} differ "
                          "(the block size is the verify width)")
    if width < 2:
        raise ConfigError(f"DFLASH block size {width}: at least 2 (one draft token)")
    return DFlashProposer(head, context, width)


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, options)
