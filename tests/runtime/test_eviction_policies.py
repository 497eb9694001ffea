"""The eviction_policy plugins: the order each evicts in, on the device tier (the radix cache)
and on the host tier of the hierarchical cache (one policy object serves both)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine.errors import ConfigError
from engine.runtime.radix_cache import RadixCache
from engine.runtime.request import ReqOutput
from engine_eviction_lfu.impl import LFU
from engine_eviction_lru.impl import LRU
from engine_eviction_priority.impl import Priority
from engine_eviction_slru.impl import SLRU
from engine_eviction_slru.impl import engine_create_eviction_policy as make_slru
from engine_eviction_tlru.impl import TLRU
from engine_eviction_tlru.impl import engine_create_eviction_policy as make_tlru
from test_hicache import A, B, C, generate, sched
from test_sched_scheduler import make_req

LENGTHS = {1: 8, 2: 2, 3: 8, 4: 2, 5: 2}


def order(policy: Any) -> list[int]:
    """Five leaves under the root, touched so that every policy orders them differently; the
    order in which single-node evictions remove them (by first token)."""
    freed: list[int] = []
    cache = RadixCache(1, lambda slots: freed.append(int(slots[0]) // 100), policy=policy)
    seqs = {i: [i] * LENGTHS[i] for i in LENGTHS}
    for i, seq in seqs.items():  # last_access 1..5; node 2 reached by a priority-5 request
        cache.insert(seq, torch.arange(len(seq)) + 100 * i, priority=5 if i == 2 else 0)
    cache.admit(seqs[5])  # hits: 5 once, 1 twice
    cache.admit(seqs[1])
    cache.admit(seqs[1])
    cache.match_prefix(seqs[4])  # looked at (recently used), not a hit
    cache.match_prefix(seqs[3])
    while cache.evict(1):
        pass
    return freed


@pytest.mark.parametrize("policy,want", [
    (LRU(), [2, 5, 1, 4, 3]),            # last access
    (LFU(), [2, 4, 3, 5, 1]),            # hits, then last access
    (SLRU(2), [2, 5, 4, 3, 1]),          # probationary (< 2 hits) by last access, then node 1
    (Priority(), [5, 1, 4, 3, 2]),       # priority 0 by last access, then the priority-5 node
    (TLRU(threshold=6, next_prompt_estimate=1), [2, 5, 4, 1, 3]),  # short tails first
    (None, [2, 5, 1, 4, 3]),             # no policy: the cache's own least recently used
])
def test_each_policy_evicts_in_its_order(policy, want) -> None:
    assert order(policy) == want


def test_tlru_scores_a_conversation_tail_safe_only_beyond_what_the_next_turn_needs() -> None:
    from engine.api.eviction import NodeView

    p = TLRU(threshold=100, next_prompt_estimate=20)
    # a conversation of 200 cached tokens: its first 120 must stay for the next turn's prefill
    # to stay within 100 uncached tokens; a node starting at 120 or later is safe to evict
    assert p.score(NodeView(last_access=9, start=120, length=80))[0] is False
    assert p.score(NodeView(last_access=1, start=100, length=100))[0] is True
    assert p.score(NodeView(last_access=9, start=120, length=80)) < \
        p.score(NodeView(last_access=1, start=100, length=100))


def test_parameters_are_checked_at_start_up() -> None:
    assert make_slru(params={"protected_threshold": 4}).protected_threshold == 4
    with pytest.raises(ConfigError, match="slru has no parameter 'threshold'"):
        make_slru(params={"threshold": 4})
    with pytest.raises(ConfigError, match="must be int"):
        make_slru(params={"protected_threshold": "4"})
    with pytest.raises(ConfigError, match="threshold > next_prompt_estimate"):
        make_tlru(params={"threshold": 10, "next_prompt_estimate": 10})


@pytest.mark.parametrize("policy,kept", [(LRU(), False), (Priority(), True)])
def test_one_policy_orders_the_host_tier_too(policy, kept) -> None:
    """The host holds two prompts: after A (priority 5), B and C, LRU drops A's host copy and
    priority drops B's."""
    s = sched(slots=40, hicache_ratio=2.0, policy=policy)
    outs: dict[str, list[ReqOutput]] = {}
    req = make_req(A, outs, max_new=4)
    req.priority = 5
    s.submit([req])
    while s.step():
        pass
    generate(s, B)
    generate(s, C)
    out = generate(s, A)
    assert (out.cached_tokens_details["host"] == 28) is kept
