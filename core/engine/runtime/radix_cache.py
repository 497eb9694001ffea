"""Radix-tree prefix cache over KV slots, page-aligned, with lock counts and LRU eviction.

Contract (the scheduler is the only user):

* ``match_prefix(tokens)`` returns the slots of the longest cached prefix whose length is a
  multiple of ``page_size``, and the tree node where it ends. The caller must ``inc_lock(node)``
  before using the slots and ``dec_lock(node)`` when done; locked nodes are never evicted.
* ``insert(tokens, slots)`` (length a multiple of ``page_size``) hands the slots to the tree and
  returns how many leading tokens were already cached: the caller owns, and must free, its own
  slots for that leading part (except what it obtained from ``match_prefix``, which were the
  tree's to begin with). The tree owns every slot it stores and frees them only on eviction.
* ``evict(num_tokens)`` frees unlocked leaves through ``free_fn``, lowest score of the eviction
  policy first (``--radix-eviction-policy``; least recently used without one), until at least
  ``num_tokens`` were freed or nothing evictable is left; it returns the count freed.
* ``admit(tokens, priority)`` is ``match_prefix`` for a request being admitted: it counts a hit
  on every matched node (what ``lfu``/``slru`` read) and says from which tier the prefix came
  (a :class:`PrefixHit`; always the device here, see :mod:`engine.runtime.hiradix_cache`).

A disabled cache (``--disable-radix-cache``) matches nothing and stores nothing: ``insert``
answers "all already cached", so the caller frees all of its slots.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from engine.api.eviction import EvictionPolicy, NodeView


@dataclass
class PrefixHit:
    """The cached prefix a request was admitted with: its device ``slots``, the tree ``node``
    where it ends, and how many of its tokens each tier supplied."""

    slots: torch.Tensor
    node: Any
    device: int = 0
    host: int = 0
    storage: int = 0

    def tiers(self) -> dict[str, int]:
        return {"device": self.device, "host": self.host, "storage": self.storage}


class TreeNode:
    """One edge of the tree: ``key`` tokens whose KV sits at ``value`` slots."""

    __slots__ = (
        "children",
        "from_storage",
        "hashes",
        "hit_count",
        "host_value",
        "key",
        "last_access",
        "lock_ref",
        "parent",
        "pinned",
        "priority",
        "start",
        "stored",
        "value",
    )

    def __init__(self, key: list[int], value: torch.Tensor | None, parent: TreeNode | None,
                 start: int = 0) -> None:
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value  #: device slots, or None when only a lower tier holds the tokens
        self.lock_ref = 0
        self.last_access = 0
        self.hit_count = 0
        self.priority = 0
        self.start = start  #: tokens of the prefix before this node
        self.host_value: torch.Tensor | None = None  #: host slots (hierarchical cache)
        self.hashes: list[str] | None = None  #: page keys, computed when first needed
        self.from_storage = False  #: fetched from storage and not yet served
        self.stored = False  #: its pages are in (or queued for) the storage tier
        self.pinned = 0  #: host copy in use by a transfer (not host-evictable)

    def view(self) -> NodeView:
        return NodeView(last_access=self.last_access, hit_count=self.hit_count,
                        priority=self.priority, start=self.start, length=len(self.key))


class RadixCache:
    """Prefix cache keyed by token ids (see the module docstring for the ownership contract)."""

    def __init__(self, page_size: int, free_fn: Callable[[torch.Tensor], None], *,
                 disabled: bool = False, policy: EvictionPolicy | None = None) -> None:
        self.page_size = page_size
        self.free_fn = free_fn
        self.disabled = disabled
        self.policy = policy
        self._clock = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        """Forget everything without freeing (the caller resets the allocator too)."""
        self.root = TreeNode([], torch.empty(0, dtype=torch.long), None)
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def _child_key(self, tokens: list[int], at: int) -> tuple[int, ...]:
        return tuple(tokens[at:at + self.page_size])

    def score(self, node: TreeNode) -> Any:
        """The eviction score of ``node`` (lowest goes first)."""
        if self.policy is None:
            return node.last_access
        return self.policy.score(node.view())

    def prefetch(self, tokens: list[int]) -> Any:
        """Start reading ``tokens``' pages from a lower tier (none here): a handle for
        :meth:`admit`, or None."""
        return None

    def admit(self, tokens: list[int], priority: int = 0, fetch: Any = None) -> PrefixHit:
        """:meth:`match_prefix` for a request being admitted: counts a hit on each matched
        node and records the request's priority there."""
        slots, node = self.match_prefix(tokens)
        self._touch_path(node, priority)
        return PrefixHit(slots, node, device=len(slots))

    def _touch_path(self, node: TreeNode, priority: int) -> None:
        while node is not self.root and node is not None:
            node.hit_count += 1
            node.priority = max(node.priority, priority)
            node = node.parent  # type: ignore[assignment]

    def close(self) -> None:
        """Release what the cache holds besides device slots (nothing here)."""

    def _match_len(self, a: list[int], b: list[int], b_at: int) -> int:
        """Length of the common page-aligned prefix of ``a`` and ``b[b_at:]``."""
        p = self.page_size
        n = min(len(a), len(b) - b_at)
        n -= n % p
        i = 0
        while i < n and a[i:i + p] == b[b_at + i:b_at + i + p]:
            i += p
        return i

    def match_prefix(self, tokens: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """Slots of the longest cached page-aligned prefix of ``tokens``, and its end node."""
        if self.disabled:
            return torch.empty(0, dtype=torch.long), self.root
        node, at, parts = self.root, 0, []
        now = next(self._clock)
        node.last_access = now
        while at < len(tokens):
            child = node.children.get(self._child_key(tokens, at))
            if child is None:
                break
            n = self._match_len(child.key, tokens, at)
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            parts.append(child.value)
            node, at = child, at + n
        slots = torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)
        return slots, node

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split ``child`` after ``n`` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None
        value = child.value
        upper = TreeNode(child.key[:n], None if value is None else value[:n], parent,
                         child.start)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.hit_count, upper.priority = child.hit_count, child.priority
        upper.from_storage, upper.pinned = child.from_storage, child.pinned
        if child.host_value is not None:
            upper.host_value = child.host_value[:n]
            child.host_value = child.host_value[n:]
        if child.hashes is not None:
            pages = n // self.page_size
            upper.hashes, child.hashes = child.hashes[:pages], child.hashes[pages:]
        parent.children[self._child_key(child.key, 0)] = upper
        child.key, child.parent = child.key[n:], upper
        child.value = None if value is None else value[n:]
        child.start += n
        upper.children[self._child_key(child.key, 0)] = child
        return upper

    def insert(self, tokens: list[int], slots: torch.Tensor, priority: int = 0) -> int:
        """Store ``tokens`` -> ``slots``; return how many leading tokens were already cached.

        A matched node may take the caller's slots for its tokens (:meth:`_matched`); the count
        then stops before the first such node, and the tree owns every slot from there on."""
        assert len(tokens) == len(slots) and len(tokens) % self.page_size == 0
        if self.disabled:
            return len(tokens)
        node, at, adopted = self.root, 0, None
        now = next(self._clock)
        while at < len(tokens):
            child = node.children.get(self._child_key(tokens, at))
            if child is None:
                new = TreeNode(list(tokens[at:]), slots[at:].clone(), node, at)
                new.last_access, new.priority = now, priority
                node.children[self._child_key(tokens, at)] = new
                self.evictable_size += len(new.key)
                self._inserted(new)
                return at if adopted is None else adopted
            n = self._match_len(child.key, tokens, at)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            child.priority = max(child.priority, priority)
            if self._matched(child, slots[at:at + n]) and adopted is None:
                adopted = at
            node, at = child, at + n
        return at if adopted is None else adopted

    def _inserted(self, node: TreeNode) -> None:
        """A new node holds device slots (the hierarchical cache backs it up here)."""

    def _matched(self, node: TreeNode, slots: torch.Tensor) -> bool:
        """``insert`` matched ``node`` whole, with the caller's ``slots`` for its tokens; True
        when the node took them (a node only a lower tier holds, in the hierarchical cache).
        Here: never."""
        return False

    def inc_lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction."""
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock(self, node: TreeNode) -> None:
        """Undo one :meth:`inc_lock` of ``node``."""
        while node is not self.root and node is not None:
            assert node.lock_ref > 0, "dec_lock without inc_lock"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free least-recently-used unlocked leaves until ``num_tokens`` are freed."""
        if self.disabled or num_tokens <= 0:
            return 0
        heap = [(self.score(n), id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, node = heapq.heappop(heap)
            self.free_fn(node.value)
            freed += len(node.key)
            self.evictable_size -= len(node.key)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key, 0)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self.score(parent), id(parent), parent))
        return freed

    def _leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def flush(self) -> int:
        """Evict everything unlocked; return the tokens freed."""
        return self.evict(self.evictable_size)
