"""``--hicache-storage-backend mooncake``: pages in a Mooncake store.

Extra config (all but the master optional): ``master_server_address`` (``host:port`` of
``mooncake_master``), ``metadata_server`` (default ``http://<master host>:8080/metadata``, the
master's embedded HTTP metadata server), ``local_hostname`` (127.0.0.1), ``protocol`` (tcp),
``device_name`` (RDMA devices, empty for tcp), ``global_segment_size`` (bytes this process
contributes to the pool, 512 MiB) and ``local_buffer_size`` (64 MiB). Keys get the model/layout
identity as a prefix, so servers of different models share one store safely.

Reads are zero-copy when the core hands targets that are consecutive slices of one buffer (it
does) and pages are at least ``zero_copy_min_page_bytes`` (256 KiB; below that the copying
path was faster on loopback TCP, benchmarks/hicache_mooncake_io.py): the buffer is registered
with the transfer engine for the call and the pages are read straight into it
(``batch_get_into``). Other reads take the copying ``get_batch``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import HiCacheStorage

KEYS = ("master_server_address", "metadata_server", "local_hostname", "protocol", "device_name",
        "global_segment_size", "local_buffer_size", "zero_copy_min_page_bytes")


class MooncakeStorage(HiCacheStorage):
    def __init__(self, store: Any, prefix: str, zero_copy_min: int = 256 * 1024) -> None:
        self.store, self.prefix, self.zero_copy_min = store, prefix, zero_copy_min
        self._lock = threading.Lock()
        #: pages read straight into the caller's buffer
        self.zero_copy_pages = 0

    def _k(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str, target: Any = None) -> Any | None:
        return self.batch_get([key], [target])[0]

    def set(self, key: str, value: Any) -> bool:
        return self.batch_set([key], [value])

    def exists(self, key: str) -> bool:
        return self.store.is_exist(self._k(key)) == 1

    def batch_get(self, keys: Sequence[str], targets: Sequence[Any] | None = None) -> list:
        span = _contiguous(targets) if targets and len(targets) == len(keys) else None
        if span is None or span[1] < self.zero_copy_min:
            got = self.store.get_batch([self._k(k) for k in keys])
            return [bytes(g) if g else None for g in got]
        base, size = span
        with self._lock:  # one registration of the buffer at a time
            if self.store.register_buffer(base, size * len(keys)) != 0:
                got = self.store.get_batch([self._k(k) for k in keys])
                return [bytes(g) if g else None for g in got]
            try:
                read = self.store.batch_get_into([self._k(k) for k in keys],
                                                 [base + i * size for i in range(len(keys))],
                                                 [size] * len(keys))
            finally:
                self.store.unregister_buffer(base)
        out = [t if n == size else (t[:n] if n > 0 else None) for t, n in zip(targets, read)]
        self.zero_copy_pages += sum(n == size for n in read)
        return out

    def batch_set(self, keys: Sequence[str], values: Sequence[Any]) -> bool:
        todo = [(self._k(k), bytes(v)) for k, v in zip(keys, values)]
        rc = self.store.put_batch([k for k, _ in todo], [v for _, v in todo])
        return rc == 0

    def batch_exists(self, keys: Sequence[str]) -> int:
        found = self.store.batch_is_exist([self._k(k) for k in keys])
        for i, f in enumerate(found):
            if f != 1:
                return i
        return len(keys)

    def clear(self) -> None:
        self.store.remove_by_regex("^" + self.prefix)

    def close(self) -> None:
        self.store.close()


def _contiguous(targets: Sequence[Any]) -> tuple[int, int] | None:
    """(address, size) when ``targets`` are writable, equally long, consecutive slices of one
    buffer; else ``None``."""
    try:
        views = [memoryview(t) for t in targets]
        size = views[0].nbytes
        base = ctypes.addressof(ctypes.c_char.from_buffer(views[0]))
        for i, v in enumerate(views[1:], 1):
            if v.nbytes != size or ctypes.addressof(ctypes.c_char.from_buffer(v)) != base + i * size:
                return None
    except (TypeError, ValueError):  # read-only or not a buffer
        return None
    return base, size


@hookimpl
def engine_create_hicache_storage(storage_config: Any) -> HiCacheStorage:
    extra = dict(storage_config.extra)
    unknown = set(extra) - set(KEYS)
    if unknown:
        raise PluginError(f"unknown extra config keys for mooncake: {', '.join(sorted(unknown))}"
                          f" (it takes {', '.join(KEYS)})")
    master = extra.get("master_server_address")
    if not master:
        raise PluginError("mooncake needs master_server_address (host:port of mooncake_master) "
                          "in --hicache-storage-backend-extra-config")
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        hint = " (apt-get install libibverbs1)" if "ibverbs" in str(exc) else ""
        raise PluginError(f"cannot load the Mooncake client: {exc}{hint}") from None
    host = str(master).rsplit(":", 1)[0]
    store = MooncakeDistributedStore()
    rc = store.setup(str(extra.get("local_hostname", "127.0.0.1")),
                     str(extra.get("metadata_server", f"http://{host}:8080/metadata")),
                     int(extra.get("global_segment_size", 512 * 2**20)),
                     int(extra.get("local_buffer_size", 64 * 2**20)),
                     str(extra.get("protocol", "tcp")), str(extra.get("device_name", "")),
                     str(master))
    if rc != 0:
        raise PluginError(f"cannot reach the Mooncake master at {master} (setup returned {rc})")
    return MooncakeStorage(store, storage_config.identity[:16] + "_",
                           int(extra.get("zero_copy_min_page_bytes", 256 * 1024)))
