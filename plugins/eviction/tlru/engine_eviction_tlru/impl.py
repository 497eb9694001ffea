"""``--radix-eviction-policy tlru``: tail-optimized LRU: the tail of a conversation that its next turn can recompute within the threshold goes first, then least recently used."""

from __future__ import annotations

from engine.api import ConfigError, hookimpl
from engine.api.eviction import EvictionPolicy, NodeView, check_params


class TLRU(EvictionPolicy):
    """A conversation whose cached prefix ends at ``L`` tokens needs only its first
    ``B = max(0, L + next_prompt_estimate - threshold)`` tokens cached for its next prefill to
    stay within ``threshold`` uncached tokens; a node starting at or after ``B`` is *safe* to
    evict (it cannot raise that conversation's tail latency) and goes first. Among safe nodes,
    and among the others, least recently used first. The prefix length ``L`` is the node's own
    end: only nodes without children on the tier are ever scored."""

    def __init__(self, threshold: int = 4096, next_prompt_estimate: int = 512) -> None:
        if threshold <= next_prompt_estimate or next_prompt_estimate < 0:
            raise ConfigError("--radix-eviction-policy-config: tlru needs threshold > "
                              f"next_prompt_estimate >= 0 (got {threshold} and "
                              f"{next_prompt_estimate}); otherwise it is plain lru")
        self.threshold, self.next_prompt_estimate = threshold, next_prompt_estimate

    def score(self, node: NodeView) -> tuple:
        keep = max(0, node.end + self.next_prompt_estimate - self.threshold)
        return (node.start < keep, node.last_access)


@hookimpl
def engine_create_eviction_policy(params: dict) -> EvictionPolicy:
    return TLRU(**check_params("tlru", params, {"threshold": int,
                                                "next_prompt_estimate": int}))
