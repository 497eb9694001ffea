"""``--radix-eviction-policy lru``: least recently used first."""

from __future__ import annotations

from engine.api import hookimpl
from engine.api.eviction import EvictionPolicy, NodeView, check_params


class LRU(EvictionPolicy):
    def score(self, node: NodeView) -> tuple:
        return (node.last_access,)


@hookimpl
def engine_create_eviction_policy(params: dict) -> EvictionPolicy:
    check_params("lru", params, {})
    return LRU()
