"""The order in which waiting requests are admitted (``--schedule-policy``), and which running
request a full KV cache retracts (``--retraction-policy``).

:func:`order` ranks the head of the queue (its first :data:`SCAN_LIMIT` requests; the rest keep
arrival order behind them). Every sort is stable, so equals keep arrival order:

* ``fcfs``: arrival order; ``random``: shuffled (seeded by ``--random-seed``);
* ``lpm``: longest cached prefix first; ``shortest-prefill-first``: fewest uncached prompt
  tokens first; ``lof``: longest output first (largest ``max_new_tokens`` left);
* ``dfs-weight``: requests that share a cached prefix together, in a depth-first walk of the
  radix tree that visits the subtree with the most waiting requests first;
* ``priority``: the request's ``priority`` first (higher first unless low values go first);
* ``routing-key``: requests whose ``routing_key`` is running already first, then one key after
  the other in order of first arrival;
* ``hrrn``: highest response ratio next, ``(wait + cost) / cost``, where the cost is the
  request's uncached prompt and output tokens at :data:`HRRN_SECONDS_PER_TOKEN` each.

With ``--enable-priority-scheduling`` the priority ranks first and the policy within it.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from engine.runtime.request import Req

SCAN_LIMIT = 128  #: waiting requests ranked per step
HRRN_SECONDS_PER_TOKEN = 1e-3  #: the cost of one token in the response ratio of ``hrrn``

POLICIES = ("fcfs", "lpm", "random", "dfs-weight", "lof", "priority", "routing-key", "hrrn",
            "shortest-prefill-first")

#: the cached prefix of a request: (its length in tokens, the radix-tree node it ends at)
Match = Callable[[Req], tuple[int, Any]]


def order(policy: str, waiting: Sequence[Req], *, match: Match, running: Sequence[Req],
          now: float, rng: random.Random, by_priority: bool = False,
          low_priority_first: bool = False) -> list[Req]:
    """``waiting`` in admission order under ``policy`` (see the module doc)."""
    head, tail = list(waiting[:SCAN_LIMIT]), list(waiting[SCAN_LIMIT:])
    sign = 1 if low_priority_first else -1
    if policy == "random":
        rng.shuffle(head)
    elif policy in ("lpm", "shortest-prefill-first", "hrrn", "dfs-weight"):
        matched = {id(r): match(r) for r in head}
        if policy == "lpm":
            head.sort(key=lambda r: -matched[id(r)][0])
        elif policy == "shortest-prefill-first":
            head.sort(key=lambda r: r.seq_len - matched[id(r)][0])
        elif policy == "hrrn":
            def ratio(r: Req) -> float:
                cost = (r.seq_len - matched[id(r)][0] + r.max_new_tokens) * \
                    HRRN_SECONDS_PER_TOKEN
                return (now - r.arrival + cost) / max(cost, HRRN_SECONDS_PER_TOKEN)
            head.sort(key=lambda r: -ratio(r))
        else:
            head = _dfs_weight(head, {k: v[1] for k, v in matched.items()})
    elif policy == "lof":
        head.sort(key=lambda r: -(r.max_new_tokens - len(r.output_ids)))
    elif policy == "priority":
        head.sort(key=lambda r: sign * r.priority)
    elif policy == "routing-key":
        live = {r.routing_key for r in running}
        first: dict[str | None, int] = {}
        for i, r in enumerate(head):
            first.setdefault(r.routing_key, i)
        head.sort(key=lambda r: (r.routing_key not in live, first[r.routing_key]))
    if by_priority and policy != "priority":
        head.sort(key=lambda r: sign * r.priority)
    return head + tail


def _dfs_weight(reqs: list[Req], nodes: dict[int, Any]) -> list[Req]:
    """Depth-first over the radix-tree nodes the requests' prefixes end at, heaviest subtree
    (most requests under it) first; requests at a node come before those below it."""
    weight: dict[int, int] = {}
    seen: dict[int, int] = {}
    for r in reqs:
        node = nodes[id(r)]
        while node is not None:
            weight[id(node)] = weight.get(id(node), 0) + 1
            seen.setdefault(id(node), len(seen))
            node = node.parent

    def path(r: Req) -> tuple[tuple[int, int], ...]:
        chain = []
        node = nodes[id(r)]
        while node is not None:
            chain.append((-weight[id(node)], seen[id(node)]))
            node = node.parent
        return tuple(reversed(chain))

    return sorted(reqs, key=path)


def retraction_victim(policy: str | None, running: Sequence[Req], *,
                      low_priority_first: bool = False) -> int:
    """Index in ``running`` of the request to retract when the KV cache is full: ``None``, the
    most recently admitted; ``length``, the longest prompt, then the shortest output so far;
    ``priority``, the lowest priority (most recently admitted among equals)."""
    if policy == "length":
        return max(range(len(running)), key=lambda i: (len(running[i].origin_input_ids),
                                                       -len(running[i].output_ids), i))
    if policy == "priority":
        sign = -1 if low_priority_first else 1
        return min(range(len(running)), key=lambda i: (sign * running[i].priority, -i))
    return len(running) - 1
