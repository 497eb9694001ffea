"""``--radix-eviction-policy slru``: segmented LRU: probationary prefixes (fewer hits than protected_threshold) first, then least recently used."""

from __future__ import annotations

from engine.api import ConfigError, hookimpl
from engine.api.eviction import EvictionPolicy, NodeView, check_params


class SLRU(EvictionPolicy):
    def __init__(self, protected_threshold: int = 2) -> None:
        if protected_threshold < 1:
            raise ConfigError("--radix-eviction-policy-config: slru protected_threshold must be "
                              f"at least 1, not {protected_threshold}")
        self.protected_threshold = protected_threshold

    def score(self, node: NodeView) -> tuple:
        return (node.hit_count >= self.protected_threshold, node.last_access)


@hookimpl
def engine_create_eviction_policy(params: dict) -> EvictionPolicy:
    return SLRU(**check_params("slru", params, {"protected_threshold": int}))
