"""The eviction_policy family's interface (hook ``engine_create_eviction_policy``).

``--radix-eviction-policy`` chooses the order in which the radix cache gives up cached prefixes,
on the device tier (when KV pages run short) and on the host tier of the hierarchical cache
alike: one policy object serves both. Only *evictable* nodes are ever scored: present on the
tier being evicted, unlocked, and with no child still on that tier. The node with the lowest
:meth:`EvictionPolicy.score` goes first; the scores are compared as Python values, so a tuple
whose last element is ``last_access`` breaks ties by least recent use, as every policy should.

A policy is built once, at start-up, from ``--radix-eviction-policy-config`` (a JSON object
given to the hook as ``params``); an unknown or invalid parameter raises
:class:`engine.api.ConfigError` naming it, so the server refuses to start.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NodeView:
    """What a policy may read about one cached node (a run of tokens of one prefix).

    :param last_access: logical clock of the last match or insert that reached the node
        (larger is more recent; never a wall-clock time)
    :param hit_count: how many requests matched the node after it was inserted
    :param priority: the highest priority of the requests that reached it
    :param start: tokens of the prefix before this node
    :param length: tokens of this node (``start + length`` is the prefix length at its end)
    """

    last_access: int
    hit_count: int = 0
    priority: int = 0
    start: int = 0
    length: int = 0

    @property
    def end(self) -> int:
        return self.start + self.length


class EvictionPolicy(ABC):
    """Orders evictable nodes: lowest score first."""

    @abstractmethod
    def score(self, node: NodeView) -> Any:
        """A comparable value (usually a tuple ending with ``node.last_access``); the node with
        the lowest one is evicted first. Must depend on ``node`` only (no state, no clock)."""


def check_params(policy: str, params: dict[str, Any], allowed: dict[str, type]) -> dict[str, Any]:
    """``params`` checked against ``allowed`` (name -> type); raises
    :class:`engine.api.ConfigError` naming the first unknown or mistyped key."""
    from engine.errors import ConfigError

    for key, value in params.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise ConfigError(f"--radix-eviction-policy-config: {policy} has no parameter "
                              f"{key!r} (it takes: {known})")
        want = allowed[key]
        if isinstance(value, bool) or not isinstance(value, want):
            raise ConfigError(f"--radix-eviction-policy-config: {policy} parameter {key!r} "
                              f"must be {want.__name__}, not {value!r}")
    return params
