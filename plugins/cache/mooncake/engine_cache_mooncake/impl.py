"""``--hicache-storage-backend mooncake``: pages in a Mooncake store.

Extra config (all but the master optional): ``master_server_address`` (``host:port`` of
``mooncake_master``), ``metadata_server`` (default ``http://<master host>:8080/metadata``, the
master's embedded HTTP metadata server), ``local_hostname`` (127.0.0.1), ``protocol`` (tcp),
``device_name`` (RDMA devices, empty for tcp), ``global_segment_size`` (bytes this process
contributes to the pool, 512 MiB) and ``local_buffer_size`` (64 MiB). Keys get the model/layout
identity as a prefix, so servers of different models share one store safely.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import HiCacheStorage

KEYS = ("master_server_address", "metadata_server", "local_hostname", "protocol", "device_name",
        "global_segment_size", "local_buffer_size")


class MooncakeStorage(HiCacheStorage):
    def __init__(self, store: Any, prefix: str) -> None:
        self.store, self.prefix = store, prefix
        self._lock = threading.Lock()

    def _k(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str, target: Any = None) -> Any | None:
        return self.batch_get([key], [target])[0]

    def set(self, key: str, value: Any) -> bool:
        return self.batch_set([key], [value])

    def exists(self, key: str) -> bool:
        return self.store.is_exist(self._k(key)) == 1

    def batch_get(self, keys: Sequence[str], targets: Sequence[Any] | None = None) -> list:
        got = self.store.get_batch([self._k(k) for k in keys])
        return [bytes(g) if g else None for g in got]

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
    return MooncakeStorage(store, storage_config.identity[:16] + "_")
