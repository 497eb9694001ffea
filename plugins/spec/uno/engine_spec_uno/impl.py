"""UNO: one forward of the target drafts a block per request.

The block is the request's last token followed by ``F - 1`` noise tokens (drawn uniformly from
the vocabulary), at the positions right after the request's KV. The draft LoRA adapter is
applied on the noise rows only, so the first row is the target alone: its argmax is the
target's own next token. Row ``j``'s argmax is the draft for position ``kv_len + j + 1``; the
``F`` drafts are verified as a chain (verify width ``F + 1``: the last token and the drafts).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from engine.api import ConfigError, hookimpl
from engine.api.speculative import Draft, Proposer, SpecContext, TargetModel

log = logging.getLogger("engine.speculative")

RANDOM_RANK = 8  #: rank of the random adapter (``--speculative-draft-load-format dummy``)


class UnoProposer(Proposer):
    drafts_trees = False

    def __init__(self, target: TargetModel, adapter: Any, forward_width: int,
                 seed: int) -> None:
        self.target, self.adapter = target, adapter
        self.forward_width = forward_width
        self.num_draft_tokens = forward_width + 1
        self._gen = torch.Generator().manual_seed(seed)
        target.prepare_block(forward_width, adapter=adapter, plain_rows=1)  # graphs: now

    def describe(self) -> str:
        return (f"UNO: the target with LoRA adapter {self.adapter.path} (rank "
                f"{self.adapter.rank}) drafts {self.forward_width} tokens per forward (chain)")

    @torch.inference_mode()
    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        live = [i for i, req in enumerate(requests) if req.kv_len >= 1]
        out = [Draft() for _ in requests]
        if not live:
            return out
        noise = torch.randint(0, self.target.vocab_size, (len(live), self.forward_width - 1),
                              generator=self._gen).tolist()
        blocks = []
        for i, row in zip(live, noise):
            req = requests[i]
            blocks.append([req.output_ids[-1] if req.output_ids else req.origin_input_ids[-1]]
                          + row)
        logits = self.target.run_block([requests[i] for i in live], blocks,
                                       adapter=self.adapter, plain_rows=1)
        for i, lg in zip(live, logits):
            if lg is not None:
                out[i] = Draft.chain(lg.argmax(-1).tolist())
        return out


def build(config: Any, context: SpecContext, options: Any) -> UnoProposer:
    target = context.target
    if target is None:
        raise ConfigError("this server cannot run the target for UNO's draft forward")
    if config.speculative_draft_model_path:
        raise ConfigError("UNO drafts with the target itself and a LoRA adapter "
                          "(--uno-lora-path); it takes no --speculative-draft-model-path")
    if context.eagle_topk not in (None, 1):
        raise ConfigError(f"--speculative-eagle-topk {context.eagle_topk}: UNO here drafts "
                          "a chain (one candidate per position); its tree mode is not built")
    width = context.num_draft_tokens
    if width is None:
        raise ConfigError("UNO needs --speculative-num-draft-tokens: the tokens one draft "
                          "forward proposes (its block: the last token and the noise)")
    if width < 2:
        raise ConfigError(f"--speculative-num-draft-tokens {width}: UNO needs at least 2")
    path = options["uno_lora_path"]
    if path is None and config.speculative_draft_load_format != "dummy":
        raise ConfigError("UNO needs --uno-lora-path (its draft LoRA adapter of the target), "
                          "or --speculative-draft-load-format dummy for a random adapter")
    seed = int(config.random_seed or 0)
    adapter = target.adapter(path, rank=RANDOM_RANK, seed=seed)
    return UnoProposer(target, adapter, int(width), seed)


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, options)
