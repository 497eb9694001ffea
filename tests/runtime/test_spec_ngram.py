"""The NGRAM proposer: the shared index of every request's text (own and others' matches,
capacity, recency, frequency) and the draft trees it builds; every installed speculative
plugin through the conformance kit."""

from __future__ import annotations

import pytest

from engine.api import Options
from engine.api.speculative import Draft, SpecContext
from engine.plugins.registry import Registry
from engine.testing.contract import run_checks
from engine.testing.speculative import FakeRequest, check, draft_failures
from engine_spec_ngram.impl import NgramProposer, RequestText, SharedIndex

DEFAULTS = {"speculative_ngram_min_bfs_breadth": 1, "speculative_ngram_max_bfs_breadth": 10,
            "speculative_ngram_match_type": "BFS", "speculative_ngram_max_trie_depth": 18,
            "speculative_ngram_capacity": 10_000_000,
            "speculative_ngram_min_match_window_size": 1,
            "speculative_ngram_max_match_window_size": 12}


def proposer(width: int = 12, **opts) -> NgramProposer:
    return NgramProposer(Options({**DEFAULTS, **opts}), SpecContext(num_draft_tokens=width))


@pytest.fixture
def confident(monkeypatch):
    """New requests draft the whole width at once (not after a ramp)."""
    import engine_spec_ngram.impl as impl

    monkeypatch.setattr(impl, "START_PACE", 100.0)


def test_matches_prefer_the_longest_then_the_most_recent():
    index = SharedIndex(capacity=100)
    text = RequestText()
    index.extend(text, [1, 2, 3, 9, 7, 2, 3, 8, 5, 2, 3])
    found = sorted(index.matches(text, 1, 4), key=lambda m: (-m[0], -text.stamps[m[2]]))
    assert [(n, pos) for n, _, pos in found] == [(2, 6), (2, 2)]  # "2 3" twice: later first
    assert index.matches(text, 3, 4) == []
    assert text.stamps == list(range(1, 12))


def test_a_repeated_text_drafts_its_continuation_as_one_chain(confident):
    text = list(range(100, 140))
    req = FakeRequest("r", [1, 2] + text + [3] + text[:5])
    d = proposer(width=12).propose([req])[0]
    assert d.token_ids[:11] == text[5:16] and d.is_chain


def test_breadth_one_drafts_chains_and_wider_drafts_trees(confident):
    req = FakeRequest("r", [5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 6])
    wide = proposer(width=8).propose([req])[0]
    # "5 6" was followed by 1, 2 and 3: three branches, the one with the most continuation
    # (1) first and deepest
    roots = [t for t, p in zip(wide.token_ids, wide.parents) if p == -1]
    assert not wide.is_chain and sorted(roots) == [1, 2, 3] and wide.token_ids[:3] == [1, 5, 6]
    assert not draft_failures(wide, proposer(width=8))
    p = proposer(width=8, speculative_ngram_max_bfs_breadth=1)
    assert not p.drafts_trees and p.propose([req])[0].is_chain


def test_prob_orders_by_frequency_and_bfs_by_recency(confident):
    # after "7": 1 follows three times, then 2 once (the most recent)
    req = FakeRequest("r", [7, 1, 7, 1, 7, 1, 7, 2, 7])
    bfs = proposer(width=3, speculative_ngram_max_bfs_breadth=1).propose([req])[0]
    prob = proposer(width=3, speculative_ngram_max_bfs_breadth=1,
                    speculative_ngram_match_type="PROB").propose([req])[0]
    assert bfs.token_ids[0] == 2 and prob.token_ids[0] == 1


def test_the_shared_trie_drafts_from_other_requests(confident):
    p = proposer(width=6)
    p.propose([FakeRequest("a", [40, 41, 42, 43, 44, 45, 46])])
    d = p.propose([FakeRequest("b", [9, 40, 41, 42])])[0]
    assert d.token_ids[:4] == [43, 44, 45, 46]


def test_released_text_stays_for_the_others_within_the_capacity(confident):
    p = proposer(width=6, speculative_ngram_capacity=30)
    a = FakeRequest("a", list(range(40, 60)))
    p.propose([a])
    p.release(a)  # 20 tokens kept
    assert p.propose([FakeRequest("b", [9, 40, 41, 42])])[0].token_ids[:3] == [43, 44, 45]
    c = FakeRequest("c", list(range(200, 220)))
    p.propose([c])
    p.release(c)  # 40 tokens released: a's go
    assert p.propose([FakeRequest("d", [9, 40, 41, 42])]) == [Draft()]
    assert p.index.kept == 20 and len(p.index.released) == 1
    for k in range(4):  # many evictions: the map drops what it no longer points into
        e = FakeRequest(f"e{k}", list(range(300 + 40 * k, 330 + 40 * k)))
        p.propose([e])
        p.release(e)
    live = sum(len(t.tokens) for t in p._state.values())
    assert p.index.entries == sum(map(len, p.index.where.values()))
    assert p.index.entries <= 2 * (p.index.kept + live)


def test_no_match_no_draft_and_release_forgets():
    p = proposer()
    req = FakeRequest("r", [1, 2, 3, 4])
    assert p.propose([req]) == [Draft()]
    p.release(req)
    p.release(req)
    assert req not in p._state


def test_bad_options_are_refused():
    from engine.api import ConfigError

    with pytest.raises(ConfigError, match="min <= max"):
        proposer(speculative_ngram_min_bfs_breadth=4, speculative_ngram_max_bfs_breadth=2)
    with pytest.raises(ConfigError, match="BFS or PROB"):
        proposer(speculative_ngram_match_type="DFS")


def test_every_installed_speculative_plugin_passes_its_checks():
    registry = Registry()
    served = [r for r in registry.family_records("speculative") if r.available]
    assert {r.name for r in served} >= {"ngram", "standalone", "eagle", "eagle3", "nextn"}
    for rec in served:
        failed = [c for c in run_checks(registry, rec) if c.status == "fail"]
        assert not failed, (rec.name, failed)


def test_the_kit_catches_malformed_drafts():
    from engine.api.speculative import Proposer

    class Bad(Proposer):
        num_draft_tokens = 3

        def propose(self, requests):
            return [Draft([1, 1, 2, 3], [-1, -1, 5, 0]) for _ in requests]

    failures = check("bad", lambda **kw: Bad())
    text = "\n".join(failures)
    assert "4 nodes for a verify width of 3" in text and "a sibling already carries" in text
    assert "parent 5 is not an earlier node" in text and "declares chains only" in text


def test_drafts_shrink_when_rejected_and_pause_then_probe():
    p = proposer(width=12)
    req = FakeRequest("r", [1, 2, 3, 4, 5] * 6)
    sizes = []
    for _ in range(3):  # the target agrees with everything: the drafts grow to the width
        sizes.append(len(p.propose([req])[0]))
        p.on_verified(req, sizes[-1])
    assert sizes == [3, 5, 8]
    for _ in range(16):
        sizes.append(len(p.propose([req])[0]))
        p.on_verified(req, 0)  # the target never agrees
    assert sizes[3] == 11 and sizes[5] < sizes[4] < sizes[3]
    assert sizes[-12:].count(0) >= 9 and any(sizes[-12:])  # idle, with a probe now and then
    grown = []
    for _ in range(30):  # the target agrees again: from the next probe on, the drafts grow
        grown.append(len(p.propose([req])[0]))
        p.on_verified(req, grown[-1])
    assert grown[-1] == 11 and grown.index(11) < 20
