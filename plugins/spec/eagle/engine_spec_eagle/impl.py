"""EAGLE / EAGLE3 / NEXTN proposers: a draft head on the target's features (see ``model``).

Per request the head keeps a contiguous K/V cache of the positions it has run with the
target's true features (``fed``); each step it first catches up over the positions the target
verified since (pairs of token ``t[k+1]`` and feature ``f[k]``), which also yields its first
draft token, then runs ``num_steps - 1`` more steps on its own outputs. Its speculative
positions are cut off at the next step. With top-k > 1 every drafted position also offers its
next ``topk - 1`` candidates as sibling leaves (a tree; needs tree verify).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.api import ConfigError, hookimpl
from engine.api.speculative import Draft, Proposer, SpecContext

from engine_spec_eagle.model import DraftHead, load_head

DEFAULTS = (3, 1, 4)  #: (steps, topk, width) when none is set


class _Seq:
    __slots__ = ("caches", "fed")

    def __init__(self, layers: int, device: torch.device, dtype: torch.dtype) -> None:
        empty = torch.empty(0, device=device, dtype=dtype)
        self.caches = [[empty, empty] for _ in range(layers)]
        self.fed = 0

    def cut(self, n: int) -> None:
        for c in self.caches:
            c[0], c[1] = c[0][:n], c[1][:n]


class EagleProposer(Proposer):
    def __init__(self, head: DraftHead, context: SpecContext, steps: int, topk: int,
                 width: int, token_map: torch.Tensor | None = None) -> None:
        self.head = head
        self.target = context.target
        self.num_steps, self.topk = steps, topk
        self.num_draft_tokens = width
        self.drafts_trees = topk > 1 and width > steps + 1
        self.hot = token_map
        self.device, self.dtype = self.target.device, self.target.dtype
        self._seqs: dict[Any, _Seq] = {}

    def describe(self) -> str:
        c = self.head.cfg
        extra = f", target layers {c.aux_layers}" if c.kind == "eagle3" else ""
        return (f"{c.kind} head ({c.num_layers} layer(s){extra}), {self.num_steps} steps, "
                f"top-{self.topk}, verify width {self.num_draft_tokens}")

    def release(self, request: Any) -> None:
        self._seqs.pop(request, None)

    def _logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits over the head's vocabulary and the map to target ids (None: identity)."""
        x = self.head.head_input(hidden)
        if self.head.lm_head is not None:
            return self.head.lm_head(x).float(), self.head.d2t
        return self.target.logits(x.to(self.dtype)), None

    def _pick(self, hidden: torch.Tensor) -> list[int]:
        logits, d2t = self._logits(hidden[-1:])
        row = logits[0]
        if self.hot is not None:
            masked = torch.full_like(row, float("-inf"))
            masked[self.hot] = row[self.hot]
            row = masked
        ids = row.topk(min(self.topk, row.shape[0])).indices
        if d2t is not None and d2t.numel():
            ids = ids + d2t[ids]
        return ids.tolist()

    @torch.inference_mode()
    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        return [self._propose(req) for req in requests]

    def _propose(self, req: Any) -> Draft:
        seq = self._seqs.get(req)
        if seq is None:
            seq = self._seqs[req] = _Seq(len(self.head.layers), self.device, self.dtype)
        kv = req.kv_len
        if kv < 1:
            return Draft()
        tokens = req.origin_input_ids + req.output_ids
        seq.cut(seq.fed)
        start = seq.fed
        if start >= kv:  # nothing newly verified (should not happen): redo the last one
            start = kv - 1
            seq.cut(start)
        feats = self.target.features(req, start, kv)
        ids = torch.tensor(tokens[start + 1:kv + 1], device=self.device)
        pos = torch.arange(start, kv, device=self.device)
        hidden = self.head(self.target.embed(ids), feats, pos, seq.caches)
        seq.fed = kv
        chain: list[int] = []
        sibs: list[list[int]] = []
        for step in range(self.num_steps):
            top = self._pick(hidden)
            chain.append(top[0])
            sibs.append(top[1:])
            if step + 1 < self.num_steps:
                tok = torch.tensor([top[0]], device=self.device)
                p = torch.tensor([kv + step], device=self.device)
                hidden = self.head(self.target.embed(tok), hidden[-1:], p, seq.caches)
        return Draft.chain_with_siblings(chain, sibs).truncated(self.num_draft_tokens - 1,
                                                                 len(chain))


def build(config: Any, context: SpecContext, want: str) -> EagleProposer:
    """The proposer of ``want`` ("eagle", "eagle3" or "mtp") from the core's options."""
    steps = context.num_steps or DEFAULTS[0]
    topk = context.eagle_topk or DEFAULTS[1]
    width = context.num_draft_tokens or (steps + 1 if topk == 1 else steps * topk + 1)
    if topk == 1 and width > steps + 1:
        raise ConfigError(f"--speculative-num-draft-tokens {width}: a chain of "
                          f"--speculative-num-steps {steps} verifies at most {steps + 1}")
    target = context.target
    if target is None:
        raise ConfigError("this server cannot give a draft head the target's features")
    fmt = config.speculative_draft_load_format
    head = load_head(config.speculative_draft_model_path, target, dummy=fmt == "dummy",
                     want=want if want != "mtp" else None, seed=config.random_seed)
    head = head.to(device=target.device, dtype=target.dtype).eval()
    target.capture(head.cfg.aux_layers if head.cfg.kind == "eagle3" else ())
    token_map = None
    if config.speculative_token_map:
        if head.cfg.kind == "eagle3":
            raise ConfigError("--speculative-token-map: an EAGLE-3 head has its own draft "
                              "vocabulary (d2t); the map is for EAGLE heads")
        try:
            token_map = torch.as_tensor(torch.load(config.speculative_token_map,
                                                   weights_only=True)).long().to(target.device)
        except Exception as exc:  # noqa: BLE001 - a start-up error with the reason
            raise ConfigError(f"--speculative-token-map {config.speculative_token_map}: "
                              f"{type(exc).__name__}: {exc}") from None
    return EagleProposer(head, context, steps, topk, width, token_map)


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, "eagle")
