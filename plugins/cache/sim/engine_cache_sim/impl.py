"""``--hicache-storage-backend sim``: keeps pages in a dict and sleeps what a store with
``sim_op_latency_us`` per call and ``sim_read_gbps``/``sim_write_gbps`` would take. Pages are
kept (so hits are real and served), but nothing leaves the process: a model of a remote store
for benchmarks, not a cache shared with anyone."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import HiCacheStorage

DEFAULTS = {"sim_write_gbps": 5.0, "sim_read_gbps": 5.0, "sim_op_latency_us": 100.0}


class SimStorage(HiCacheStorage):
    def __init__(self, write_gbps: float, read_gbps: float, op_latency_us: float) -> None:
        self.write_bps, self.read_bps = write_gbps * 1e9, read_gbps * 1e9
        self.latency = op_latency_us * 1e-6
        self._pages: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _sleep(self, nbytes: int, bps: float) -> None:
        delay = self.latency + (nbytes / bps if bps > 0 else 0.0)
        if delay > 0:
            time.sleep(delay)

    def get(self, key: str, target: Any = None) -> Any | None:
        return self.batch_get([key], [target])[0]

    def set(self, key: str, value: Any) -> bool:
        return self.batch_set([key], [value])

    def exists(self, key: str) -> bool:
        self._sleep(0, self.read_bps)
        return key in self._pages

    def batch_get(self, keys: Sequence[str], targets: Sequence[Any] | None = None) -> list:
        with self._lock:
            got = [self._pages.get(k) for k in keys]
        self._sleep(sum(len(g) for g in got if g is not None), self.read_bps)
        return got

    def batch_set(self, keys: Sequence[str], values: Sequence[Any]) -> bool:
        data = [bytes(v) for v in values]
        self._sleep(sum(len(d) for d in data), self.write_bps)
        with self._lock:
            self._pages.update(zip(keys, data))
        return True

    def batch_exists(self, keys: Sequence[str]) -> int:
        self._sleep(0, self.read_bps)
        for i, k in enumerate(keys):
            if k not in self._pages:
                return i
        return len(keys)

    def clear(self) -> None:
        with self._lock:
            self._pages.clear()


@hookimpl
def engine_create_hicache_storage(storage_config: Any) -> HiCacheStorage:
    extra = dict(storage_config.extra)
    unknown = set(extra) - set(DEFAULTS)
    if unknown:
        raise PluginError(f"unknown extra config keys for sim: {', '.join(sorted(unknown))} "
                          f"(it takes {', '.join(DEFAULTS)})")
    cfg = dict(DEFAULTS, **extra)
    return SimStorage(float(cfg["sim_write_gbps"]), float(cfg["sim_read_gbps"]),
                      float(cfg["sim_op_latency_us"]))
