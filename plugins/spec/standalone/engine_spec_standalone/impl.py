"""STANDALONE: a draft model of the same tokenizer proposes greedy chains (top-k siblings)."""

from __future__ import annotations

from typing import Any, Sequence

from engine.api import ConfigError, hookimpl
from engine.api.speculative import Draft, DraftModel, Proposer, SpecContext

DEFAULT_STEPS, DEFAULT_TOPK = 3, 1


class StandaloneProposer(Proposer):
    """Drafts with a :class:`DraftModel`; keeps, per request, the tokens fed to its KV."""

    def __init__(self, draft: DraftModel, num_steps: int, topk: int, width: int) -> None:
        self.draft = draft
        self.num_steps, self.topk = num_steps, topk
        self.num_draft_tokens = width
        self.drafts_trees = topk > 1 and width > num_steps + 1
        self._fed: dict[Any, list[int]] = {}

    def describe(self) -> str:
        return (f"draft model, {self.num_steps} steps, top-{self.topk}, verify width "
                f"{self.num_draft_tokens}" + (" (tree)" if self.drafts_trees else " (chain)"))

    def release(self, request: Any) -> None:
        self._fed.pop(request, None)
        self.draft.release(request)

    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        if not requests:
            return []
        items = []
        for req in requests:
            tokens = req.origin_input_ids + req.output_ids
            fed = self._fed.get(req, [])
            start = min(self.draft.length(req), len(fed))
            n = 0
            while n < start and n < len(tokens) and fed[n] == tokens[n]:
                n += 1
            n = min(n, len(tokens) - 1)  # the last token is always fed: its logits are wanted
            items.append((req, n, tokens[n:]))
            self._fed[req] = tokens
        chains: list[list[int]] = [[] for _ in requests]
        siblings: list[list[list[int]]] = [[] for _ in requests]
        for step in range(self.num_steps):
            logits = self.draft.extend(items)
            k = min(self.topk, logits.shape[-1])
            top = logits.topk(k, dim=-1).indices.tolist() if k > 1 else \
                logits.argmax(dim=-1)[:, None].tolist()
            items = []
            for i, req in enumerate(requests):
                chains[i].append(top[i][0])
                siblings[i].append(top[i][1:])
                if step + 1 < self.num_steps:
                    fed = self._fed[req]
                    items.append((req, len(fed), [top[i][0]]))
                    fed.append(top[i][0])
        return [self._draft(c, s) for c, s in zip(chains, siblings)]

    def _draft(self, chain: list[int], siblings: list[list[int]]) -> Draft:
        return Draft.chain_with_siblings(chain, siblings).truncated(self.num_draft_tokens - 1,
                                                                     len(chain))


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    steps = context.num_steps or DEFAULT_STEPS
    topk = context.eagle_topk or DEFAULT_TOPK
    width = context.num_draft_tokens or (steps + 1 if topk == 1 else steps * topk + 1)
    if topk == 1 and width > steps + 1:
        raise ConfigError(f"--speculative-num-draft-tokens {width}: a chain of "
                          f"--speculative-num-steps {steps} verifies at most {steps + 1}")
    if width < 2:
        raise ConfigError("--speculative-num-draft-tokens: at least 2 (one draft token)")
    return StandaloneProposer(context.load_draft_model(), steps, topk, width)
