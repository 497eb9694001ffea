"""``--radix-eviction-policy priority``: lowest request priority first (the highest of the requests that reached a prefix), then least recently used."""

from __future__ import annotations

from engine.api import hookimpl
from engine.api.eviction import EvictionPolicy, NodeView, check_params


class Priority(EvictionPolicy):
    def score(self, node: NodeView) -> tuple:
        return (node.priority, node.last_access)


@hookimpl
def engine_create_eviction_policy(params: dict) -> EvictionPolicy:
    check_params("priority", params, {})
    return Priority()
