"""The radix prefix cache and the page allocator: match, insert, LRU eviction, locks, pages."""

from __future__ import annotations

import pytest
import torch

from engine.runtime.allocator import OutOfMemory, PageAllocator, ReqToTokenRows
from engine.runtime.radix_cache import RadixCache


class Freed:
    def __init__(self) -> None:
        self.slots: list[int] = []

    def __call__(self, slots: torch.Tensor) -> None:
        self.slots.extend(slots.tolist())


def t(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


def test_match_returns_the_longest_cached_prefix() -> None:
    cache = RadixCache(1, Freed())
    assert cache.insert([1, 2, 3, 4], t([10, 11, 12, 13])) == 0
    slots, _ = cache.match_prefix([1, 2, 3, 9, 9])
    assert slots.tolist() == [10, 11, 12]
    assert cache.match_prefix([7])[0].numel() == 0
    assert cache.total_size == 4


def test_insert_reports_what_was_already_cached_and_splits_nodes() -> None:
    cache = RadixCache(1, Freed())
    cache.insert([1, 2, 3, 4], t([10, 11, 12, 13]))
    assert cache.insert([1, 2, 5], t([20, 21, 22])) == 2  # caller frees its 20, 21
    assert cache.total_size == 5
    assert cache.match_prefix([1, 2, 5])[0].tolist() == [10, 11, 22]
    assert cache.match_prefix([1, 2, 3, 4])[0].tolist() == [10, 11, 12, 13]


def test_page_aligned_matching() -> None:
    cache = RadixCache(2, Freed())
    cache.insert([1, 2, 3, 4], t([2, 3, 4, 5]))
    assert cache.match_prefix([1, 2, 3])[0].tolist() == [2, 3]  # 3 tokens -> one page
    assert cache.match_prefix([1, 2, 3, 9])[0].tolist() == [2, 3]
    assert cache.match_prefix([1, 9, 3, 4])[0].numel() == 0
    assert cache.insert([1, 2, 7, 8], t([6, 7, 8, 9])) == 2


def test_evict_frees_least_recently_used_leaves_first() -> None:
    freed = Freed()
    cache = RadixCache(1, freed)
    cache.insert([1, 2], t([10, 11]))
    cache.insert([3, 4], t([20, 21]))
    cache.insert([5, 6], t([30, 31]))
    cache.match_prefix([1, 2])  # 1,2 is now the most recent
    assert cache.evict(3) == 4
    assert sorted(freed.slots) == [20, 21, 30, 31]
    assert cache.match_prefix([1, 2])[0].tolist() == [10, 11]


def test_evicting_a_leaf_exposes_its_parent() -> None:
    freed = Freed()
    cache = RadixCache(1, freed)
    cache.insert([1, 2, 3], t([10, 11, 12]))
    cache.insert([1, 2, 4], t([10, 11, 13]))
    assert cache.evict(100) == 4
    assert sorted(freed.slots) == [10, 11, 12, 13]
    assert cache.total_size == 0


def test_locked_nodes_are_not_evicted() -> None:
    freed = Freed()
    cache = RadixCache(1, freed)
    cache.insert([1, 2, 3], t([10, 11, 12]))
    cache.insert([5], t([20]))
    _, node = cache.match_prefix([1, 2, 3])
    cache.inc_lock(node)
    assert cache.protected_size == 3 and cache.evictable_size == 1
    assert cache.evict(100) == 1
    assert freed.slots == [20]
    cache.dec_lock(node)
    assert cache.evictable_size == 3
    assert cache.evict(100) == 3


def test_a_lock_on_a_split_node_protects_the_ancestors() -> None:
    cache = RadixCache(1, Freed())
    cache.insert([1, 2, 3, 4], t([10, 11, 12, 13]))
    _, node = cache.match_prefix([1, 2])  # splits [1,2] | [3,4]
    cache.inc_lock(node)
    assert cache.evict(100) == 2  # only the [3, 4] leaf
    assert cache.match_prefix([1, 2, 3])[0].tolist() == [10, 11]
    cache.dec_lock(node)


def test_disabled_cache_matches_and_keeps_nothing() -> None:
    cache = RadixCache(1, Freed(), disabled=True)
    assert cache.insert([1, 2], t([5, 6])) == 2  # "all cached": the caller frees its slots
    assert cache.match_prefix([1, 2, 3])[0].numel() == 0
    assert cache.total_size == 0


def test_allocator_never_hands_out_page_zero() -> None:
    alloc = PageAllocator(num_slots=16, page_size=4)
    assert alloc.capacity_tokens == 12
    pages = alloc.alloc_pages(3)
    assert 0 not in pages and sorted(pages) == [1, 2, 3]
    with pytest.raises(OutOfMemory):
        alloc.alloc_pages(1)
    alloc.free_slots([4, 5, 6])  # slots of page 1
    assert alloc.num_free_pages == 1


def test_freed_pages_come_back_in_ascending_runs() -> None:
    """Pages freed together are handed out again lowest first, whatever order they were freed
    in (a hierarchical cache then copies a run of them in one transfer)."""
    alloc = PageAllocator(num_slots=64, page_size=4)
    first = alloc.alloc_pages(8)
    assert first == list(range(1, 9))
    alloc.free_pages([6, 3, 5, 4])
    assert alloc.alloc_pages(4) == [3, 4, 5, 6]
    alloc.free_slots(list(range(4 * 3, 4 * 7)))  # pages 3..6 again, as slots
    alloc.free_pages([8, 7])
    assert alloc.alloc_pages(6) == [7, 8, 3, 4, 5, 6]  # two runs: the last freed first


def test_slots_continue_a_partly_filled_page() -> None:
    alloc = PageAllocator(num_slots=32, page_size=4)
    slots, pages = alloc.slots_for(None, 0, 6)
    assert len(pages) == 2 and len(slots) == 6
    assert slots[:4] == list(range(pages[0] * 4, pages[0] * 4 + 4))
    more, new_pages = alloc.slots_for(slots[-1], 6, 3)
    assert more[:2] == [slots[-1] + 1, slots[-1] + 2] and len(new_pages) == 1
    assert alloc.pages_needed(9, 3) == 0 and alloc.pages_needed(8, 1) == 1


def test_out_of_memory_takes_nothing() -> None:
    alloc = PageAllocator(num_slots=8, page_size=2)
    with pytest.raises(OutOfMemory):
        alloc.slots_for(None, 0, 7)
    assert alloc.num_free_pages == 3


def test_request_rows() -> None:
    rows = ReqToTokenRows(2)
    a, b = rows.alloc(), rows.alloc()
    assert {a, b} == {0, 1}
    with pytest.raises(OutOfMemory):
        rows.alloc()
    rows.free(a)
    assert rows.alloc() == a
