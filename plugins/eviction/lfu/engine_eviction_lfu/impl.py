"""``--radix-eviction-policy lfu``: fewest hits first, then least recently used."""

from __future__ import annotations

from engine.api import hookimpl
from engine.api.eviction import EvictionPolicy, NodeView, check_params


class LFU(EvictionPolicy):
    def score(self, node: NodeView) -> tuple:
        return (node.hit_count, node.last_access)


@hookimpl
def engine_create_eviction_policy(params: dict) -> EvictionPolicy:
    check_params("lfu", params, {})
    return LFU()
