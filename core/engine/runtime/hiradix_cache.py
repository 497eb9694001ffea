"""The hierarchical radix cache (``--enable-hierarchical-cache``): device pool, host pool,
storage.

Every tree node knows where its tokens' K/V lives: ``value`` (device slots) and ``host_value``
(host slots), either or both; a node that neither tier holds is not in the tree. The device
copies form a top part of the tree (a node on the device has its parent on the device), so a
match is a run of device nodes followed by a run of host-only nodes.

* **Backup** (device -> host) happens when a node is inserted (``write_through``), on its
  second hit (``write_through_selective``), or when the device evicts it (``write_back``, and
  whatever an earlier backup could not place). Every page that reaches the host is also queued
  for the storage tier when there is one (:mod:`engine.runtime.page_store`).
* **Device eviction** frees a node's device slots and keeps the node when the host holds it;
  otherwise the node (and any host-only nodes below it) is dropped.
* **Host eviction** frees host copies, the policy's lowest score first; a host-only node losing
  its copy leaves the tree.
* **Admission** (:meth:`HiRadixCache.admit`) makes device room for the host-only run of the
  match, then queues its load back into device pages layer by layer (the copy stream on CUDA;
  the next forward waits for each layer's copy just before that layer) and reports how many
  tokens each tier supplied.
* **buffer_only** (``--hicache-host-memory-mode``): the host pool only stages pages for the
  storage tier. A page leaves it once its storage write is queued (the write holds its own
  copy) or once it has been loaded to the device; a node then lives on the device, or only in
  storage (out of the tree, found again by its key).
* **Prefetch**: when a request arrives, the pages of its prompt beyond what the tree holds are
  looked up in storage by key and read on the I/O thread; once read they enter the tree as
  host-only nodes (``from_storage``) and admission loads them like any host hit. How long
  admission waits for a read still in flight is ``--hicache-storage-prefetch-policy``.

One eviction policy object orders both tiers.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from engine.runtime.host_pool import HostKVPool, Transfer
from engine.runtime.page_store import CORE_KEYS, Fetch, PageCodec, StorageTier, page_keys
from engine.runtime.radix_cache import PrefixHit, RadixCache, TreeNode

log = logging.getLogger("engine.hicache")

class HiRadixCache(RadixCache):
    """Radix cache over a device pool, a host pool and an optional storage tier."""

    def __init__(self, page_size: int, free_fn: Callable[[torch.Tensor], None], *,
                 allocator: Any, host: HostKVPool, transfer: Transfer,
                 write_policy: str = "write_through", policy: Any = None,
                 storage: StorageTier | None = None, identity: str = "",
                 prefetch_policy: str = "best_effort",
                 prefetch: dict[str, float] | None = None, buffer_only: bool = False) -> None:
        self.allocator, self.host, self.transfer = allocator, host, transfer
        self.buffer_only = buffer_only
        self.write_policy, self.storage, self.identity = write_policy, storage, identity
        self.prefetch_policy = prefetch_policy
        self.prefetch_cfg = dict(CORE_KEYS, **(prefetch or {}))
        self.codec = PageCodec(host.payload_bytes)
        self._fetches: list[Fetch] = []
        super().__init__(page_size, free_fn, policy=policy)

    def reset(self) -> None:
        super().reset()
        self.host.reset()
        self._fetches = []

    def close(self) -> None:
        if self.storage is not None:
            self.storage.close()

    # ------------------------------------------------------------------ matching

    def match_prefix(self, tokens: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """The device part of the longest match (no copy between tiers)."""
        path = self._walk(tokens, split=True)
        path = path[:_device_run(path)]
        slots = torch.cat([n.value for n in path]) if path else torch.empty(0, dtype=torch.long)
        return slots, (path[-1] if path else self.root)

    def _walk(self, tokens: list[int], *, split: bool) -> list[TreeNode]:
        """The nodes of the longest match of ``tokens`` in any tier (``split``: cut the last
        node where the match ends; else the match ends before a partly matched node)."""
        node, at, path = self.root, 0, []
        now = next(self._clock)
        while at < len(tokens):
            child = node.children.get(self._child_key(tokens, at))
            if child is None:
                break
            n = self._match_len(child.key, tokens, at)
            if n == 0 or (n < len(child.key) and not split):
                break
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            path.append(child)
            node, at = child, at + n
        return path

    def admit(self, tokens: list[int], priority: int = 0, fetch: Fetch | None = None
              ) -> PrefixHit:
        """Match ``tokens``, load their host-only run back to the device as far as room allows,
        and report the tiers (``fetch``: this request's storage read, waited for as the
        prefetch policy says)."""
        if fetch is not None:
            self._wait(fetch)
        self.poll()
        path = self._walk(tokens, split=True)
        dev = path[:_device_run(path)]
        hit = PrefixHit(torch.empty(0, dtype=torch.long), self.root,
                        device=sum(len(n.key) for n in dev))
        last = dev[-1] if dev else self.root
        self.inc_lock(last)
        todo = path[len(dev):]
        claimed: list[TreeNode] = []
        for node in todo:  # their host copies are read below: none is host-evicted meanwhile
            node.pinned += 1
        try:
            self._room_for(todo)
            for node in todo:
                if not self._claim(node):
                    break
                claimed.append(node)
                self.inc_lock(node)
                self.dec_lock(last)
                last = node
                if node.from_storage:
                    hit.storage += len(node.key)
                    node.from_storage = False
                else:
                    hit.host += len(node.key)
            self._load(claimed)
        finally:
            for node in todo:
                node.pinned -= 1
        self.dec_lock(last)
        loaded = path[:_device_run(path)]
        hit.node = loaded[-1] if loaded else self.root
        if loaded:
            hit.slots = torch.cat([n.value for n in loaded])
        self._touch_path(hit.node, priority)
        if self.write_policy == "write_through_selective":
            self._backup([n for n in loaded if n.host_value is None and n.hit_count >= 2])
        return hit

    def _room_for(self, nodes: list[TreeNode]) -> None:
        """Evict for the device pages of all of ``nodes`` at once, before any is loaded: the
        backups an eviction queues then come before the loads on the copy stream, and the
        compute stream, which waits for a backup, need not wait for those loads (see
        :class:`engine.runtime.host_pool.Transfer`). ``nodes`` are pinned by the caller, so
        a backup's room on the host does not come from them."""
        need = sum(len(n.key) for n in nodes) - self.allocator.free_tokens
        if need > 0:
            self.evict(need)

    def _claim(self, node: TreeNode) -> bool:
        """Give ``node`` (pinned by the caller) device slots for its host pages (copied by
        :meth:`_load`); False when no room."""
        need = len(node.key)
        if self.allocator.free_tokens < need:
            self.evict(need - self.allocator.free_tokens)
        if self.allocator.free_tokens < need:
            return False
        pages = self.allocator.alloc_pages(need // self.page_size)
        dev = torch.tensor(pages, dtype=torch.long)[:, None] * self.page_size
        node.value = (dev + torch.arange(self.page_size)).reshape(-1)
        assert node.host_value is not None
        if node.lock_ref == 0:
            self.evictable_size += need
        else:
            self.protected_size += need
        return True

    def _load(self, nodes: list[TreeNode]) -> None:
        """Copy the host pages of ``nodes`` (a run of the tree, claimed, locked and pinned) into
        their device slots as one load: its layers are copied in turn across all the nodes, so
        the forward's first layers wait for their share of every node, not for whole nodes
        before them (a conversation's prefix is a chain of nodes, one a turn)."""
        if not nodes:
            return
        self.transfer.to_device(torch.cat([n.host_value for n in nodes]),
                                torch.cat([n.value for n in nodes]))
        if self.buffer_only:  # staged: the pages are in storage (they came from there)
            self.transfer.settle()
            for n in nodes:
                self.host.free(n.host_value)
                n.host_value = None
                n.stored = True

    # ------------------------------------------------------------------ backup and eviction

    def _matched(self, node: TreeNode, slots: torch.Tensor) -> bool:
        """A matched node only a lower tier holds takes the caller's device slots for its
        tokens, so the device copies stay a top part of the tree (see
        :meth:`RadixCache.insert`)."""
        if node.value is not None:
            return False
        node.value = slots.clone()
        node.from_storage = False
        if node.lock_ref == 0:
            self.evictable_size += len(slots)
        else:
            self.protected_size += len(slots)
        return True

    def _inserted(self, node: TreeNode) -> None:
        if self.write_policy == "write_through":
            self._backup([node])

    def _backup(self, nodes: list[TreeNode]) -> None:
        """Copy each node's device pages to the host (evicting host copies for room) and queue
        them for storage; a node that finds no host room stays device-only."""
        for node in nodes:
            if node.host_value is not None or node.value is None or (
                    self.buffer_only and node.stored):  # (its pages are in storage already)
                continue
            need = len(node.key)
            node.pinned += 1
            try:
                if self.host.free_tokens < need:
                    self._evict_host(need - self.host.free_tokens)
                slots = self.host.alloc(need)
            finally:
                node.pinned -= 1
            if slots is None:
                continue
            # the CPU reads the pages only to store them
            self.transfer.to_host(node.value, slots, wait=self.storage is not None)
            node.host_value = slots
            self._store(node)

    def _store(self, node: TreeNode) -> None:
        if self.storage is None or node.host_value is None:
            return
        keys = self._hashes(node)
        ps = self.page_size
        blobs = [self.codec.encode(k, self.host.page_payload(int(node.host_value[i * ps])))
                 for i, k in enumerate(keys)]
        self.storage.write(keys, blobs)
        node.stored = True
        if self.buffer_only:  # the write holds its own copy: the staging pages go back
            self.host.free(node.host_value)
            node.host_value = None

    def _hashes(self, node: TreeNode) -> list[str]:
        if node.hashes is None:
            parent = node.parent
            prev = self.identity if parent is None or parent is self.root \
                else self._hashes(parent)[-1]
            node.hashes = page_keys(node.key, self.page_size, prev)
        return node.hashes

    def evict(self, num_tokens: int, *, backup: bool = True) -> int:
        """Free device pages, the policy's lowest score first: a node the host holds (or can
        take now, with ``backup``, unless the write policy is selective) stays in the tree
        without its device copy; any other leaves the tree."""
        if num_tokens <= 0:
            return 0
        heap = [(self.score(n), id(n), n) for n in self._device_leaves()]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, node = heapq.heappop(heap)
            if node.host_value is None and backup and \
                    self.write_policy != "write_through_selective":
                self._backup([node])
            self.free_fn(node.value)
            freed += len(node.key)
            self.evictable_size -= len(node.key)
            node.value = None
            parent = node.parent
            if node.host_value is None:
                self._drop(node)
            if (parent is not self.root and parent.lock_ref == 0 and parent.value is not None
                    and not any(c.value is not None for c in parent.children.values())):
                heapq.heappush(heap, (self.score(parent), id(parent), parent))
        return freed

    def _device_leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            on_dev = [c for c in node.children.values() if c.value is not None]
            if node is not self.root and node.value is not None and not on_dev \
                    and node.lock_ref == 0:
                out.append(node)
            stack.extend(on_dev)
        return out

    def _drop(self, node: TreeNode) -> None:
        """Take ``node`` (holding no device slots) and its subtree out, freeing host copies."""
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.host_value is not None:
                self.host.free(n.host_value)
                n.host_value = None
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.key, 0)]

    def _evict_host(self, num_tokens: int) -> int:
        """Free host copies, lowest score first, until ``num_tokens`` are free'd."""
        def candidates() -> list[TreeNode]:
            out, stack = [], [self.root]
            while stack:
                n = stack.pop()
                stack.extend(n.children.values())
                if n is not self.root and n.host_value is not None and n.pinned == 0 and \
                        (n.value is not None or not n.children):
                    out.append(n)
            return out

        heap = [(self.score(n), id(n), n) for n in candidates()]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, node = heapq.heappop(heap)
            assert node.host_value is not None
            self.host.free(node.host_value)
            node.host_value = None
            freed += len(node.key)
            parent = node.parent
            if node.value is None:
                self._drop(node)
                if (parent is not self.root and parent is not None and parent.value is None
                        and parent.host_value is not None and not parent.children
                        and parent.pinned == 0):
                    heapq.heappush(heap, (self.score(parent), id(parent), parent))
        return freed

    def flush(self) -> int:
        """Drop every unlocked device and host copy; return the device tokens freed."""
        freed = self.evict(self.evictable_size, backup=False)
        self._evict_host(self.host.capacity_tokens)
        return freed

    # ------------------------------------------------------------------ storage prefetch

    def prefetch(self, tokens: list[int]) -> Fetch | None:
        """Queue a storage read of ``tokens``' pages beyond what the tree holds (when at least
        ``prefetch_threshold`` tokens); the handle :meth:`admit` waits on."""
        if self.storage is None:
            return None
        self.poll()
        ps = self.page_size
        aligned = len(tokens) - len(tokens) % ps
        held = sum(len(n.key) for n in self._walk(tokens[:aligned], split=False))
        if aligned - held < max(ps, int(self.prefetch_cfg["prefetch_threshold"])):
            return None
        keys = page_keys(tokens[:aligned], ps, self.identity)
        fetch = self.storage.fetch(list(tokens[:aligned]), held, keys[held // ps:])
        self._fetches.append(fetch)
        return fetch

    def _budget(self, fetch: Fetch) -> float:
        """Seconds admission waits for ``fetch``'s answer (``--hicache-storage-prefetch-policy``:
        none for best_effort), counted from the first wait."""
        cfg, policy = self.prefetch_cfg, self.prefetch_policy
        if policy == "best_effort":
            return 0.0
        budget = float(cfg["prefetch_timeout_max"])
        if policy == "timeout":
            budget = min(budget, float(cfg["prefetch_timeout_base"]) + float(
                cfg["prefetch_timeout_per_ki_token"]) * len(fetch.tokens) / 1024)
        return budget

    def _waited(self, fetch: Fetch) -> float:
        if fetch.wait_from is None:
            fetch.wait_from = time.monotonic()
        return time.monotonic() - fetch.wait_from

    def awaits(self, fetch: Fetch) -> bool:
        """Whether admission would still wait for ``fetch``'s answer now (not done, and the
        policy's budget not spent): a caller may keep the request queued meanwhile instead."""
        return not fetch.done.is_set() and self._waited(fetch) < self._budget(fetch)

    def _wait(self, fetch: Fetch) -> None:
        budget = self._budget(fetch)
        if budget <= 0 or fetch.done.is_set():
            return
        if not fetch.done.wait(max(0.0, budget - self._waited(fetch))):
            log.warning("storage read of %d pages not done after %.1f s (%s); admitting with "
                        "what the faster tiers hold", len(fetch.keys), budget,
                        self.prefetch_policy)

    def poll(self) -> None:
        """Put the pages of finished storage reads into the tree as host-only nodes."""
        if not self._fetches:
            return
        pending = []
        for f in self._fetches:
            if f.done.is_set():
                self._attach(f)
            else:
                pending.append(f)
        self._fetches = pending

    def _attach(self, f: Fetch) -> None:
        ps = self.page_size
        end = f.start + len(f.payloads) * ps
        if end <= f.start:
            return
        path = self._walk(f.tokens[:end], split=True)
        held = sum(len(n.key) for n in path)
        if held < f.start or held >= end:
            return  # the tree changed since: a gap before the pages, or it holds them already
        need = end - held
        if self.host.free_tokens < need:
            self._evict_host(need - self.host.free_tokens)
        slots = self.host.alloc(need)
        if slots is None:
            log.info("no host room for %d tokens read from storage", need)
            return
        first = (held - f.start) // ps
        self.transfer.settle()  # no copy still reads the freed pages these slots came from
        for i in range(need // ps):
            self.host.write_payload(int(slots[i * ps]), f.payloads[first + i])
        parent = path[-1] if path else self.root
        node = TreeNode(list(f.tokens[held:end]), None, parent, held)
        node.host_value, node.from_storage, node.stored = slots, True, True
        node.hashes = f.keys[first:first + need // ps]
        node.last_access = next(self._clock)
        parent.children[self._child_key(node.key, 0)] = node


def _device_run(path: list[TreeNode]) -> int:
    """How many leading nodes of ``path`` hold device slots."""
    k = 0
    while k < len(path) and path[k].value is not None:
        k += 1
    return k
