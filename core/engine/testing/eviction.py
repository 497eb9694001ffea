"""Conformance suite of the eviction_policy family (``engine plugins check NAME``).

A policy built with no parameters must give every node a score that compares with every other
node's, depend on the node alone (the same view scores the same), break ties by least recent
use (nodes alike but for ``last_access`` go oldest first), and refuse an unknown parameter with
a :class:`engine.api.ConfigError`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from engine.api.eviction import NodeView
from engine.errors import ConfigError


def run(make: Callable[[dict[str, Any]], Any], *, seed: int = 0) -> list[str]:
    fails: list[str] = []
    policy = make({})
    rng = random.Random(seed)
    views = [NodeView(last_access=rng.randrange(1000), hit_count=rng.randrange(5),
                      priority=rng.randrange(-2, 3), start=rng.randrange(0, 4096, 16),
                      length=rng.randrange(16, 1024, 16)) for _ in range(200)]
    try:
        sorted(views, key=policy.score)
    except TypeError as exc:
        fails.append(f"scores do not compare: {exc}")
    if any(policy.score(v) != policy.score(NodeView(**v.__dict__)) for v in views):
        fails.append("the score of a node is not a function of the node alone")
    for base in views[:20]:
        older = NodeView(**dict(base.__dict__, last_access=base.last_access))
        newer = NodeView(**dict(base.__dict__, last_access=base.last_access + 1))
        if not policy.score(older) < policy.score(newer):
            fails.append("ties are not broken by least recent use")
            break
    try:
        make({"no_such_parameter": 1})
        fails.append("an unknown parameter was accepted")
    except ConfigError:
        pass
    return fails


def check(name: str, product: Callable[..., Any]) -> list[str]:
    return run(lambda params: product(config=product.config, params=params))
