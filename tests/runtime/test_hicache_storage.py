"""Every storage plugin that runs on this machine: the conformance kit, and a prompt evicted
past the host tier coming back from the store.

Mooncake (a local master on loopback TCP, started here) and NIXL (its POSIX plugin) run when
their wheels are installed (``tools/hicache/setup_backends.sh``), and are skipped with the
reason otherwise.
"""

from __future__ import annotations

import importlib
import inspect
import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from engine.api import Options
from engine.api.hicache import DirectoryStorage, StorageConfig
from engine.testing.hicache import run as conformance
from test_hicache import A, B, C, Hanging, generate, sched


def plugin_store(name: str, extra: dict[str, Any]) -> Callable[[StorageConfig], Any]:
    """A factory building ``name``'s store through its hook, with its declared options."""
    manifest = importlib.import_module(f"engine_cache_{name}").plugin
    impl = importlib.import_module(f"engine_cache_{name}.impl")
    options = Options({o.dest: o.default for o in manifest.options})

    def make(sc: StorageConfig) -> Any:
        sc = StorageConfig(**dict(sc.__dict__, extra=dict(extra)))
        hook = impl.engine_create_hicache_storage
        args = {"options": options, "storage_config": sc}
        wanted = inspect.signature(hook).parameters
        return hook(**{k: v for k, v in args.items() if k in wanted})

    return make


@pytest.fixture(scope="module")
def mooncake_master() -> Iterator[str]:
    try:
        importlib.import_module("mooncake.store")
    except ImportError as exc:
        pytest.skip(f"Mooncake client not usable ({exc}); run tools/hicache/setup_backends.sh")
    from engine.testing.hicache import mooncake_master as start

    with start() as (master, meta):
        yield f"{master}|{meta}"


def _nixl() -> None:
    for module in ("nixl_cu12", "nixl_cu13", "nixl"):
        try:
            importlib.import_module(module)
            return
        except ImportError:
            continue
    pytest.skip("no NIXL wheel (pip install --no-deps nixl-cu12); run "
                "tools/hicache/setup_backends.sh")


THIRD_PARTY = '''
import threading
from engine.api.hicache import HiCacheStorage


class DictStore(HiCacheStorage):
    """A store from outside the engine, built by the dynamic plugin."""

    def __init__(self, storage_config):
        self.pages, self.lock = {}, threading.Lock()
        self.page_bytes = storage_config.page_bytes
        self.tag = storage_config.extra.get("tag")

    def get(self, key, target=None):
        return self.pages.get(key)

    def set(self, key, value):
        with self.lock:
            self.pages[key] = bytes(value)
        return True

    def exists(self, key):
        return key in self.pages
'''


@pytest.fixture()
def backend(request, tmp_path, monkeypatch) -> Callable[[StorageConfig], Any]:
    name = request.param
    if name == "file":
        return plugin_store("file", {"path": str(tmp_path / "file")})
    if name == "shm":
        if not os.path.isdir("/dev/shm"):
            pytest.skip("no /dev/shm here")
        root = f"/dev/shm/engine-hicache-test-{os.getpid()}-{tmp_path.name}"
        request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
        return plugin_store("shm", {"path": root})
    if name == "sim":
        return plugin_store("sim", {"sim_op_latency_us": 0, "sim_read_gbps": 0,
                                    "sim_write_gbps": 0})
    if name == "hf3fs":
        return plugin_store("hf3fs", {"use_mock_hf3fs_client": True,
                                      "file_path": str(tmp_path / "hf3fs" / "pages.bin"),
                                      "file_size": 64 * 2**20})
    if name == "dynamic":
        (tmp_path / "acme_store.py").write_text(THIRD_PARTY)
        monkeypatch.syspath_prepend(str(tmp_path))
        return plugin_store("dynamic", {"module_path": "acme_store", "class_name": "DictStore",
                                        "tag": "x"})
    if name == "nixl":
        _nixl()
        return plugin_store("nixl", {"path": str(tmp_path / "nixl")})
    if name == "mooncake":
        master, meta = request.getfixturevalue("mooncake_master").split("|")
        return plugin_store("mooncake", {"master_server_address": master,
                                         "metadata_server": meta,
                                         "global_segment_size": 64 * 2**20,
                                         "local_buffer_size": 16 * 2**20})
    raise AssertionError(name)


BACKENDS = ["file", "shm", "sim", "hf3fs", "dynamic", "nixl", "mooncake"]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_conformance(backend) -> None:
    assert conformance(backend, interrupt_points=6) == []


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_prompt_evicted_past_the_host_tier_comes_back_from_the_store(backend) -> None:
    s = sched(slots=40, hicache_ratio=1.0, store=backend)
    for p in (A, B, C):
        generate(s, p)
    out = generate(s, A)
    assert out.cached_tokens_details == {"device": 0, "host": 0, "storage": 28}
    s.stop()


def test_mooncake_reads_into_the_callers_buffer(mooncake_master) -> None:
    """Targets that are slices of one buffer (what the core hands) are registered and read into
    directly; a missing key in the middle is None; separate buffers take the copying path."""
    master, meta = mooncake_master.split("|")
    store = plugin_store("mooncake", {"master_server_address": master, "metadata_server": meta,
                                      "global_segment_size": 64 * 2**20,
                                      "local_buffer_size": 16 * 2**20,
                                      "zero_copy_min_page_bytes": 0})(
        StorageConfig(page_bytes=4096, identity="ab" * 32))
    try:
        pages = [os.urandom(4096) for _ in range(4)]
        keys = [f"{i:064x}" for i in range(4)]
        assert store.batch_set(keys, pages)
        arena = memoryview(bytearray(5 * 4096))
        targets = [arena[i * 4096:(i + 1) * 4096] for i in range(5)]
        got = store.batch_get(keys[:2] + ["e" * 64] + keys[2:], targets)
        assert got[2] is None and store.zero_copy_pages == 4
        for i, page in zip((0, 1, 3, 4), pages):
            assert got[i] is targets[i] and bytes(got[i]) == page
        apart = store.batch_get(keys[:2], [memoryview(bytearray(4096)) for _ in range(2)])
        assert [bytes(g) for g in apart] == pages[:2] and store.zero_copy_pages == 4
    finally:
        store.clear()
        store.close()


def test_dynamic_refuses_a_class_it_cannot_load() -> None:
    from engine.api import PluginError

    make = plugin_store("dynamic", {"module_path": "no_such_module_here", "class_name": "X"})
    with pytest.raises(PluginError, match="cannot load no_such_module_here.X"):
        make(StorageConfig(page_bytes=128))
    with pytest.raises(PluginError, match="needs module_path and class_name"):
        plugin_store("dynamic", {})(StorageConfig(page_bytes=128))


def test_hf3fs_without_the_mock_names_what_it_needs() -> None:
    from engine.api import PluginError

    with pytest.raises(PluginError, match="3FS mount and its USRBIO bindings"):
        plugin_store("hf3fs", {})(StorageConfig(page_bytes=128))


class Torn(DirectoryStorage):
    """Writes straight into the key's file: a killed write leaves a torn page."""

    def set(self, key: str, value: Any) -> bool:
        with open(self._path(key), "wb", buffering=0) as fh:
            data = bytes(value)
            fh.writelines(data[at:at + 512] for at in range(0, len(data), 512))
        return True


def test_the_kit_catches_a_store_that_can_leave_a_torn_page(tmp_path) -> None:
    fails = conformance(lambda sc: Torn(str(tmp_path)), interrupt_points=8)
    assert any("torn page" in f for f in fails)


class Committing(DirectoryStorage):
    """A shared store whose pages written by another server become visible only after
    ``hide`` existence checks (their backup still committing). Each check takes a while, so
    the scheduler looks at the waiting request before its read has answered."""

    def __init__(self, path: str, hide: int) -> None:
        super().__init__(path)
        self.hide, self.checks = hide, 0

    def batch_exists(self, keys):
        time.sleep(0.05)
        self.checks += 1
        return 0 if self.checks <= self.hide else super().batch_exists(keys)


@pytest.mark.parametrize("interval,attempts,found", [(0, 3, 0), (2, 3, 28), (1, 1, 0)])
def test_a_storage_read_that_found_nothing_is_issued_again(tmp_path, interval, attempts,
                                                          found) -> None:
    writer = sched(store=DirectoryStorage(str(tmp_path)))
    generate(writer, A)
    writer.stop()  # its pages are in the shared store
    store = Committing(str(tmp_path), hide=2)
    s = sched(store=store, hicache_storage_prefetch_retry_poll_interval=interval,
              hicache_storage_prefetch_retry_max_attempts=attempts)
    out = generate(s, A)  # the first check and (with one attempt) the only retry see nothing
    assert out.cached_tokens_details == {"device": 0, "host": 0, "storage": found}
    assert store.checks == 1 + (attempts if interval and not found else (2 if found else 0))
    s.stop()


def test_a_read_that_never_answers_is_waited_for_only_the_policys_budget(tmp_path) -> None:
    writer = sched(store=DirectoryStorage(str(tmp_path)))
    generate(writer, A)
    writer.stop()
    store = Hanging(str(tmp_path))  # answers once released: never, during the request
    s = sched(store=store, hicache_storage_prefetch_retry_poll_interval=1,
              hicache_storage_backend_extra_config='{"prefetch_threshold": 4, '
              '"prefetch_timeout_max": 0.05}')
    out = generate(s, A)  # kept queued while the policy waits, then admitted: recomputed
    assert out.cached_tokens_details["storage"] == 0
    store.release.set()
    s.stop()
