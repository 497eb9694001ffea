"""The hierarchical KV cache against a stand-in model whose KV is its token ids.

The stand-in writes each token id into every layer of a real :class:`KVPool` (K = id, V = -id)
and predicts the next token from the ids it reads back through ``req_to_token``: a page loaded
from the host pool or from storage into the wrong slots, or with the wrong bytes, changes the
output. Tests compare outputs with the plain function of the token list and read which tier
the cached prefix came from (``cached_tokens_details``).
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from engine.errors import ConfigError
import torch
from engine.api.hicache import DirectoryStorage, HiCacheStorage
from engine.config import ServerConfig
from engine.runtime.attention import KVPool
from engine.runtime.batch import Batch
from engine.runtime.hiradix_cache import HiRadixCache
from engine.runtime.host_pool import HostKVPool, Transfer
from engine.runtime.page_store import PageCodec, identity, page_keys
from engine.runtime.request import ReqOutput
from engine.runtime.scheduler import Scheduler
from test_sched_scheduler import VOCAB, expected, make_req, next_token

PS = 4  #: page size of these tests


class KVStandIn:
    """``forward(batch) -> logits`` from the token ids stored in a real KV pool."""

    def __init__(self, num_slots: int, page_size: int = PS, rows: int = 8, ctx: int = 256,
                 layers: int = 2) -> None:
        self.device = torch.device("cpu")
        self.pool = KVPool(num_layers=layers, num_kv_heads=1, head_dim=2, num_slots=num_slots,
                           page_size=page_size, dtype=torch.float32, device=self.device)
        self.req_to_token = torch.zeros(rows, ctx, dtype=torch.long)
        self.model_config = SimpleNamespace(architecture="StandIn", model_path="standin",
                                            num_hidden_layers=layers, num_key_value_heads=1,
                                            head_dim=2)
        self.prefill_tokens = 0

    def forward(self, batch: Batch) -> torch.Tensor:
        if not batch.is_decode:
            self.prefill_tokens += int(batch.extend_lens.sum())
        ids = batch.input_ids.float()[:, None, None].expand(-1, 1, 2)
        loads = self.pool.take_loads()  # as the decoder does: each layer after its loads
        for layer in range(self.pool.num_layers):
            if loads is not None:
                loads.wait(layer)
            self.pool.write(layer, batch.out_cache_loc, ids + layer, -ids)
        ends = torch.cumsum(batch.extend_lens, 0) - 1
        logits = torch.zeros(len(batch.logits_indices), VOCAB)
        for j, tok_idx in enumerate(batch.logits_indices.tolist()):
            i = int((ends < tok_idx).sum())
            row, n = int(batch.req_pool_indices[i]), batch.seq_lens_cpu[i]
            slots = self.req_to_token[row, :n]
            k = self.pool.k[-1][slots, 0, 0] - (self.pool.num_layers - 1)
            assert torch.equal(k, -self.pool.v[0][slots, 0, 1]), "K and V disagree"
            logits[j, next_token(k.long().tolist())] = 10.0
        return logits


def sched(tmp_path: Any = None, *, slots: int = 64, store: Any = None, policy: Any = None,
          **cfg: Any) -> Scheduler:
    """A scheduler with the hierarchical cache over a ``slots``-slot device pool."""
    cfg.setdefault("hicache_ratio", 2.0)
    cfg.setdefault("hicache_storage_prefetch_policy", "wait_complete")
    cfg.setdefault("hicache_storage_backend_extra_config", '{"prefetch_threshold": 4}')
    if store is not None:
        cfg.setdefault("hicache_storage_backend", "test")
    config = ServerConfig(page_size=PS, enable_hierarchical_cache=True, **cfg)
    factory = (lambda storage_config: store(storage_config) if callable(store) else store) \
        if store is not None else None
    return Scheduler(config, KVStandIn(slots), eviction=policy, storage_factory=factory)


def generate(s: Scheduler, prompt: list[int], n: int = 4) -> ReqOutput:
    outs: dict[str, list[ReqOutput]] = {}
    req = make_req(prompt, outs, max_new=n)
    s.submit([req])
    for _ in range(1000):
        if not s.step():
            break
    got = outs[req.rid]
    assert got and got[-1].finished
    assert [t for o in got for t in o.token_ids] == expected(prompt, n)
    return got[-1]


def prompt(seed: int, n: int = 30) -> list[int]:
    return [(seed * 7 + i * 3) % VOCAB for i in range(n)]


A, B, C, D = (prompt(s) for s in (1, 2, 3, 4))


def test_a_prefix_evicted_from_the_device_is_served_from_the_host_tier() -> None:
    s = sched()
    generate(s, A)
    generate(s, B)
    before = s.runner.prefill_tokens
    out = generate(s, A)  # the device pool (60 tokens) held B over A; the host kept A
    assert out.cached_tokens == 28
    assert out.cached_tokens_details == {"device": 0, "host": 28, "storage": 0}
    assert s.runner.prefill_tokens - before == 30 - 28


def test_with_the_host_tier_too_small_the_prefix_comes_from_storage(tmp_path) -> None:
    s = sched(slots=40, hicache_ratio=1.0, store=DirectoryStorage(str(tmp_path)))
    for p in (A, B, C):
        generate(s, p)
    out = generate(s, A)
    assert out.cached_tokens_details == {"device": 0, "host": 0, "storage": 28}
    assert s.cache.storage.stats.pages_read == 7


def test_after_a_restart_the_file_store_serves_the_prompt(tmp_path) -> None:
    s = sched(slots=128, store=DirectoryStorage(str(tmp_path)))
    generate(s, A + B)
    s.stop()  # drains the queued writes
    s2 = sched(slots=128, store=DirectoryStorage(str(tmp_path)))
    out = generate(s2, A + B)
    assert out.cached_tokens_details == {"device": 0, "host": 0, "storage": 56}
    out = generate(s2, A + C)  # shares A's pages: a hit on whatever tier holds them
    assert out.cached_tokens == 28


def test_a_corrupted_or_short_page_is_a_miss_and_recomputed(tmp_path, caplog) -> None:
    s = sched(slots=128, store=DirectoryStorage(str(tmp_path)))
    generate(s, A + B)
    s.stop()
    keys = page_keys((A + B)[:56], PS, s.cache.identity)
    with open(tmp_path / f"{keys[3]}.kv", "r+b") as fh:  # flip a byte of page 3's payload
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 1]))
    with open(tmp_path / f"{keys[9]}.kv", "r+b") as fh:
        fh.truncate(50)
    s2 = sched(slots=128, store=DirectoryStorage(str(tmp_path)))
    with caplog.at_level(logging.WARNING, "engine.hicache"):
        out = generate(s2, A + B)
    assert out.cached_tokens_details["storage"] == 3 * PS  # pages 0-2, then the bad page
    assert "corrupted" in caplog.text
    assert s2.cache.storage.stats.corrupt == 1


class Failing(HiCacheStorage):
    """A store whose every call raises."""

    def get(self, key: str, target: Any = None) -> Any:
        raise ConnectionError("store down")

    def set(self, key: str, value: Any) -> bool:
        raise ConnectionError("store down")

    def exists(self, key: str) -> bool:
        raise ConnectionError("store down")


def test_a_store_that_errors_degrades_to_recompute_with_a_log_line(caplog) -> None:
    s = sched(slots=40, hicache_ratio=1.0, store=Failing())
    with caplog.at_level(logging.WARNING, "engine.hicache"):
        for p in (A, B, C, A):
            out = generate(s, p)
    assert out.cached_tokens_details["storage"] == 0
    assert "store down" in caplog.text and "recomputed" in caplog.text
    assert s.cache.storage.stats.errors >= 4


class Hanging(DirectoryStorage):
    """A store whose reads block until released."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.release = threading.Event()

    def batch_exists(self, keys: Any) -> int:
        self.release.wait()
        return super().batch_exists(keys)


def test_a_store_that_times_out_degrades_to_recompute(tmp_path, caplog) -> None:
    store = Hanging(str(tmp_path))
    s = sched(slots=40, hicache_ratio=1.0, store=store,
              hicache_storage_prefetch_policy="timeout",
              hicache_storage_backend_extra_config='{"prefetch_threshold": 4, '
              '"prefetch_timeout_base": 0.01, "prefetch_timeout_per_ki_token": 0, '
              '"prefetch_timeout_max": 0.01}')
    with caplog.at_level(logging.WARNING, "engine.hicache"):
        for p in (A, B, C, A):
            out = generate(s, p)
    assert out.cached_tokens_details["storage"] == 0
    assert "not done after" in caplog.text
    store.release.set()
    s.stop()


def test_a_full_disk_degrades_to_recompute(tmp_path, monkeypatch, caplog) -> None:
    real_open = builtins.open

    class Full:
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.fh, name)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

    def full_open(path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        fh = real_open(path, mode, *args, **kw)
        return Full(fh) if "w" in mode and str(path).endswith(".tmp") else fh

    monkeypatch.setattr(builtins, "open", full_open)
    s = sched(slots=40, hicache_ratio=1.0, store=DirectoryStorage(str(tmp_path)))
    with caplog.at_level(logging.WARNING, "engine.hicache"):
        for p in (A, B, C, A):
            out = generate(s, p)
        s.stop()
    assert out.cached_tokens_details["storage"] == 0
    assert "No space left on device" in caplog.text
    assert os.listdir(tmp_path) == []  # no page, no stray temporary file
    assert s.cache.storage.stats.write_failures > 0


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_write_policies_decide_when_pages_reach_the_host(policy) -> None:
    s = sched(hicache_write_policy=policy)
    generate(s, A, n=1)
    node = next(iter(s.cache.root.children.values()))
    assert (node.host_value is not None) == (policy == "write_through")
    generate(s, A, n=1)
    generate(s, A, n=1)  # a second hit on the node
    node = next(iter(s.cache.root.children.values()))
    assert (node.host_value is not None) == (policy != "write_back")
    generate(s, prompt(2, 40))  # evicts A from the device: write_back backs it up now
    out = generate(s, A, n=1)
    assert out.cached_tokens_details["host"] == 28


def test_page_keys_are_a_hash_chain_of_model_identity_and_tokens() -> None:
    model = SimpleNamespace(architecture="X", model_path="m", num_hidden_layers=2,
                            num_key_value_heads=1, head_dim=2)
    ident = identity(model, torch.float32, PS)
    keys = page_keys(A, PS, ident)
    assert len(keys) == 7 and all(len(k) == 64 for k in keys)
    assert page_keys(A[:12], PS, ident) == keys[:3]  # a prefix has the prefix's keys
    changed = list(A)
    changed[1] += 1
    assert all(a != b for a, b in zip(page_keys(changed, PS, ident), keys))  # every later page
    other = identity(SimpleNamespace(**dict(model.__dict__, model_path="n")), torch.float32, PS)
    assert page_keys(A, PS, other)[0] != keys[0]


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize("io", ["kernel", "direct"])
def test_host_pool_layouts_round_trip_and_share_one_payload(layout, io) -> None:
    dev = KVPool(num_layers=3, num_kv_heads=2, head_dim=4, num_slots=32, page_size=PS,
                 dtype=torch.float32, device=torch.device("cpu"))
    for layer in range(3):
        dev.k[layer].copy_(torch.randn(32, 2, 4))
        dev.v[layer].copy_(torch.randn(32, 2, 4))
    host = HostKVPool(dev, 16, layout=layout)
    t = Transfer(dev, host, io)
    src = torch.arange(8, 16)
    dst = host.alloc(8)
    t.to_host(src, dst)
    payload = bytes(host.page_payload(int(dst[PS])))
    ref = torch.stack([torch.stack([dev.k[layer][12:16] for layer in range(3)]),
                       torch.stack([dev.v[layer][12:16] for layer in range(3)])])
    assert payload == ref.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    back = torch.arange(20, 28)
    old = [dev.k[layer][20:28].clone() for layer in range(3)]
    t.to_device(dst, back)
    loads = dev.take_loads()
    for layer in range(3):
        # a layer's load is waited for just before the layer: on a CPU it runs only then
        assert torch.equal(dev.k[layer][20:28], old[layer])
        loads.wait(layer)
        assert torch.equal(dev.k[layer][20:28], dev.k[layer][8:16])
        assert torch.equal(dev.v[layer][20:28], dev.v[layer][8:16])
    host.write_payload(int(dst[0]), payload)  # payloads move between pages and layouts
    assert bytes(host.page_payload(int(dst[0]))) == payload


@pytest.mark.parametrize("one_allocation", [True, False])
def test_direct_copies_cover_the_layers_of_a_run_in_one_2d_copy(monkeypatch,
                                                                one_allocation) -> None:
    """``direct`` where each side's layers lie at a constant distance: one 2-D copy per run of
    pages and side covers every layer (K and V land where the per-layer copies put them);
    per-layer device tensors fall back to a copy per run, layer and side."""
    from engine.runtime import host_pool

    dev = KVPool(num_layers=3, num_kv_heads=2, head_dim=4, num_slots=32, page_size=PS,
                 dtype=torch.float32, device=torch.device("cpu"))
    if not one_allocation:
        dev.k, dev.v = [t.clone() for t in dev.k], [t.clone() for t in dev.v]
    for layer in range(3):
        dev.k[layer].copy_(torch.randn(32, 2, 4))
        dev.v[layer].copy_(torch.randn(32, 2, 4))
    calls: list[int] = []  # heights
    real = host_pool._memcpy_2d_cpu

    def spy(*args: Any, **kw: Any) -> None:
        calls.append(args[5])
        real(*args, **kw)

    monkeypatch.setattr(host_pool, "_memcpy_2d_cpu", spy)
    host = HostKVPool(dev, 32, layout="layer_first")
    t = Transfer(dev, host, "direct")
    src = torch.cat([torch.arange(4, 12), torch.arange(20, 24)])  # two runs of pages
    dst = host.alloc(12)
    t.to_host(src, dst)
    for layer in range(3):
        assert torch.equal(host.k[layer][dst], dev.k[layer][src])
        assert torch.equal(host.v[layer][dst], dev.v[layer][src])
    assert calls == ([3] * 4 if one_allocation else []), calls  # 2 runs x K, V
    calls.clear()
    back = torch.arange(24, 32)
    t.to_device(dst[:8], back)
    dev.take_loads().wait_all()
    for layer in range(3):
        assert torch.equal(dev.k[layer][back], dev.k[layer][src[:8]])
        assert torch.equal(dev.v[layer][back], dev.v[layer][src[:8]])
    assert len(calls) == (3 * 2 if one_allocation else 0)  # (a CPU loads layer by layer)


def test_copies_between_the_tiers_move_runs_of_pages_after_churn(monkeypatch) -> None:
    """After the device and host pools have been filled, evicted and refilled, a backup or a
    load still moves consecutive pages on both sides as one run (one copy per run, layer and
    side with ``direct``), not one copy per page: freed pages come back in ascending runs."""
    copies: list[tuple[int, int]] = []  # (pages, runs)
    prepare = Transfer._prepare

    def spy(self: Transfer, dev_slots: torch.Tensor, host_slots: torch.Tensor) -> Any:
        runs = prepare(self, dev_slots, host_slots)
        copies.append((len(dev_slots) // self.host.page_size, len(runs)))
        return runs

    monkeypatch.setattr(Transfer, "_prepare", spy)
    s = sched(slots=256, hicache_io_backend="direct", hicache_ratio=4.0)
    convs = [prompt(i, 60) for i in range(1, 9)]
    for turn in range(3):
        for i, p in enumerate(convs):
            generate(s, p)
            convs[i] = p + [(j * 5 + turn) % 50 for j in range(20)]
    pages, runs = sum(p for p, _ in copies), sum(r for _, r in copies)
    assert len(copies) > 20 and pages > 300, copies
    assert runs * 4 <= pages, copies  # one page a run would be runs == pages


def test_a_hit_on_several_nodes_is_loaded_as_one_copy(monkeypatch) -> None:
    """A conversation's prefix is a chain of nodes (one a turn). Loading it back is one load
    over all of them, so the forward's first layer waits for its own share of every node and
    not for the whole of the nodes before the last."""
    loads: list[int] = []
    to_device = Transfer.to_device

    def spy(self: Transfer, host_slots: torch.Tensor, dev_slots: torch.Tensor) -> None:
        loads.append(len(dev_slots))
        to_device(self, host_slots, dev_slots)

    monkeypatch.setattr(Transfer, "to_device", spy)
    s = sched(slots=128, hicache_ratio=4.0)
    conv = prompt(1, 20)
    for turn in range(3):  # three turns: the tree holds the prefix as a chain of nodes
        generate(s, conv)
        conv = conv + expected(conv, 4) + [(j * 5 + turn) % 50 for j in range(12)]
    chain = s.cache._walk(conv, split=False)
    assert len(chain) >= 3, chain
    for i in range(2, 6):  # other prompts push the conversation out of the device pool
        generate(s, prompt(i, 60))
    assert all(n.value is None and n.host_value is not None
               for n in s.cache._walk(conv, split=False))
    loads.clear()
    out = generate(s, conv)
    assert out.cached_tokens_details["host"] >= 40, out.cached_tokens_details
    assert loads == [out.cached_tokens_details["host"]], loads


def test_a_claimed_node_keeps_its_host_copy_until_its_load_is_queued(monkeypatch) -> None:
    """A hit's nodes get their device slots one by one and are copied together afterwards;
    a later node's eviction may back pages up and so evict host copies. Until the load is
    queued, none of the hit's host copies may be among them, neither those claimed already
    nor those still to claim (here the harshest case: every host copy that may be evicted is,
    after each claim)."""
    claim = HiRadixCache._claim

    def claim_then_evict_host(self: HiRadixCache, node: Any) -> bool:
        ok = claim(self, node)
        self._evict_host(self.host.capacity_tokens)
        return ok

    s = sched(slots=128, hicache_ratio=4.0)
    conv = prompt(1, 20)
    for turn in range(3):
        generate(s, conv)
        conv = conv + expected(conv, 4) + [(j * 5 + turn) % 50 for j in range(12)]
    for i in range(2, 6):
        generate(s, prompt(i, 60))
    monkeypatch.setattr(HiRadixCache, "_claim", claim_then_evict_host)
    out = generate(s, conv)  # (generate checks the tokens)
    assert out.cached_tokens_details["host"] >= 40, out.cached_tokens_details


def test_the_io_backend_left_unset_is_index_copies_on_cpu() -> None:
    """Unset, --hicache-io-backend is the faster copy measured on the device (index copies on
    CPU; on a GPU the copy engines); named, it is taken as given."""
    assert sched().cache.transfer.io == "kernel"
    assert sched(hicache_io_backend="direct").cache.transfer.io == "direct"


def test_the_page_codec_refuses_short_corrupted_and_misplaced_pages() -> None:
    codec = PageCodec(256)
    key, other = "a" * 64, "b" * 64
    blob = codec.encode(key, bytes(range(256)))
    assert bytes(codec.decode(key, blob)) == bytes(range(256))
    assert codec.decode(other, blob) is None
    assert codec.decode(key, blob[:-1]) is None
    assert codec.decode(key, bytes(blob) + b"x") is None
    blob[200] ^= 1
    assert codec.decode(key, blob) is None


def test_the_host_tier_is_evicted_too_and_never_holds_a_gap() -> None:
    s = sched(slots=40, hicache_ratio=1.0)
    for p in (A, B, C, D, A, B):
        generate(s, p)
    cache: HiRadixCache = s.cache  # type: ignore[assignment]
    stack = list(cache.root.children.values())
    while stack:
        n = stack.pop()
        assert n.value is not None or n.host_value is not None, "a node no tier holds"
        if n.value is not None and n.parent is not cache.root:
            assert n.parent.value is not None, "a device node under a host-only node"
        stack.extend(n.children.values())
    assert cache.host.free_tokens + sum(
        len(n.key) for n in _nodes(cache) if n.host_value is not None) == \
        cache.host.capacity_tokens


def _nodes(cache: HiRadixCache) -> list[Any]:
    out, stack = [], list(cache.root.children.values())
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


def test_best_effort_admits_without_waiting_for_storage(tmp_path) -> None:
    store = Hanging(str(tmp_path))
    s = sched(slots=40, hicache_ratio=1.0, store=store,
              hicache_storage_prefetch_policy="best_effort")
    store.release.set()
    for p in (A, B, C):
        generate(s, p)
    store.release.clear()  # the read of A hangs: admission does not wait for it
    out = generate(s, A)
    assert out.cached_tokens_details["storage"] == 0
    store.release.set()
    s.stop()


def test_flush_drops_device_and_host_copies() -> None:
    s = sched()
    generate(s, A)
    s.flush_cache().wait(0)
    s.step()
    out = generate(s, A)
    assert out.cached_tokens == 0


def test_hierarchical_cache_refuses_what_it_cannot_serve() -> None:
    from engine.errors import ConfigError

    for cfg, msg in [({"disable_radix_cache": True}, "disable-radix-cache"),
                     ({"hicache_mem_layout": "page_head"}, "one rank"),
                     ({"hicache_io_backend": "kernel_ascend"}, "Ascend")]:
        with pytest.raises(ConfigError, match=msg):
            sched(**cfg)
    with pytest.raises(ConfigError, match="needs --enable-hierarchical-cache"):
        Scheduler(ServerConfig(page_size=PS, hicache_storage_backend="file"), KVStandIn(64))


def test_a_request_that_recomputed_a_host_only_prefix_gives_the_tree_its_device_copy() -> None:
    """When a host-only prefix could not be loaded at admission (no room) the request computes
    it; inserting it then makes those nodes device-resident again with the request's slots
    (never a device node under a host-only one), and no slot is freed twice."""
    s = sched(slots=64)
    cache: HiRadixCache = s.cache  # type: ignore[assignment]
    alloc = s.allocator
    tokens = list(range(1, 33))
    first = torch.tensor(alloc.slots_for(None, 0, 32)[0])
    assert cache.insert(tokens, first) == 0
    assert cache.evict(32) == 32  # to the host tier only
    assert next(iter(cache.root.children.values())).value is None
    again = torch.tensor(alloc.slots_for(None, 0, 40)[0])
    longer = tokens + list(range(40, 48))
    present = cache.insert(longer, again)
    assert present == 0  # nothing to free: the tree took every slot
    slots, node = cache.match_prefix(longer)
    assert torch.equal(slots, again)
    assert _device_run_ok(cache)
    assert cache.evictable_size == 40 and alloc.free_tokens == 60 - 40


def _device_run_ok(cache: HiRadixCache) -> bool:
    return all(n.value is None or n.parent is cache.root or n.parent.value is not None
               for n in _nodes(cache))


def test_buffer_only_stages_pages_for_storage_and_keeps_none(tmp_path) -> None:
    """``--hicache-host-memory-mode buffer_only``: every page written to storage or loaded to
    the device leaves the host pool; a prefix evicted from the device comes back from storage
    (not from a host copy), with the same output."""
    s = sched(slots=40, store=DirectoryStorage(str(tmp_path)),
              hicache_host_memory_mode="buffer_only", hicache_ratio=None)
    assert s.cache.buffer_only and s.cache.host.capacity_tokens == int(
        s.allocator.capacity_tokens * 1.2) // PS * PS
    generate(s, A)
    assert s.cache.host.free_tokens == s.cache.host.capacity_tokens  # nothing kept on the host
    for p in (B, C):
        generate(s, p)
    assert s.cache.host.free_tokens == s.cache.host.capacity_tokens
    out = generate(s, A)
    assert out.cached_tokens_details == {"device": 0, "host": 0, "storage": 28}
    assert s.cache.host.free_tokens == s.cache.host.capacity_tokens  # loaded, then let go
    out = generate(s, A)  # now on the device
    assert out.cached_tokens_details["device"] == 28
    s.stop()


def test_buffer_only_needs_a_storage_backend() -> None:
    with pytest.raises(ConfigError, match="needs --hicache-storage-backend"):
        sched(hicache_host_memory_mode="buffer_only")


def test_host_memory_fraction_shrinks_the_default_host_pool(monkeypatch) -> None:
    from engine.runtime import kv_cache

    full = sched(hicache_ratio=None)  # no fraction: the default ratio, 2.0
    per_token = full.runner.pool.bytes_per_token
    monkeypatch.setattr(kv_cache, "_host_memory_limit",
                        lambda available: kv_cache.HOST_RESERVE_BYTES + 100 * per_token)
    s = sched(hicache_ratio=None, hicache_host_memory_fraction=0.5)
    assert s.cache.host.capacity_tokens == 48  # 50 tokens fit, in whole pages of 4
    assert full.cache.host.capacity_tokens == 2 * full.allocator.capacity_tokens
    explicit = sched(hicache_ratio=2.0, hicache_host_memory_fraction=0.5)  # a ratio wins
    assert explicit.cache.host.capacity_tokens == full.cache.host.capacity_tokens
    with pytest.raises(ConfigError, match="holds no KV page"):
        sched(hicache_ratio=None, hicache_host_memory_fraction=0.01)
