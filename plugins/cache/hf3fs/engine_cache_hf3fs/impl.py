"""``--hicache-storage-backend hf3fs``: pages at fixed offsets of one large file.

Extra config: ``use_mock_hf3fs_client`` (bool): the mock client does ``pread``/``pwrite`` on a
sparse local file, for machines without 3FS; without it the 3FS USRBIO bindings
(``hf3fs_fuse.io``) must be importable, and are refused here with that reason otherwise.
``file_path`` (the page file), ``file_size`` (bytes, default 1 GiB: the capacity; full means
later pages are not stored).

Which key sits at which slot is the file's own index: a JSON index file beside it, rewritten
atomically after every batch. A slot is written before the index names it, so a crash leaves at
worst an unused slot, never an index entry pointing at half a page.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import HiCacheStorage


class MockClient:
    """The mock of the 3FS USRBIO client: positional reads and writes on a local file."""

    def __init__(self, path: str, size: int) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)

    def write(self, offset: int, data: Any) -> int:
        return os.pwrite(self.fd, data, offset)

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def close(self) -> None:
        os.close(self.fd)


class HF3FSStorage(HiCacheStorage):
    def __init__(self, client: Any, path: str, size: int, page_bytes: int) -> None:
        self.client, self.page_bytes = client, page_bytes
        self.num_slots = size // page_bytes
        self.index_path = path + ".index.json"
        self._lock = threading.Lock()
        self.index: dict[str, int] = {}
        if os.path.exists(self.index_path):
            with open(self.index_path, encoding="utf-8") as fh:
                saved = json.load(fh)
            if saved.get("page_bytes") == page_bytes:
                self.index = {k: int(v) for k, v in saved["slots"].items()}
        used = set(self.index.values())
        self.free = [s for s in range(self.num_slots - 1, -1, -1) if s not in used]

    def _save_index(self) -> None:
        tmp = f"{self.index_path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"page_bytes": self.page_bytes, "slots": self.index}, fh)
        os.replace(tmp, self.index_path)

    def get(self, key: str, target: Any = None) -> Any | None:
        with self._lock:
            slot = self.index.get(key)
        if slot is None:
            return None
        data = self.client.read(slot * self.page_bytes, self.page_bytes)
        return data if len(data) == self.page_bytes else None

    def set(self, key: str, value: Any) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: Sequence[str], values: Sequence[Any]) -> bool:
        ok = True
        with self._lock:
            for key, value in zip(keys, values):
                if key in self.index:
                    continue
                if not self.free or len(memoryview(value).cast("B")) != self.page_bytes:
                    ok = False
                    continue
                slot = self.free.pop()
                if self.client.write(slot * self.page_bytes, value) != self.page_bytes:
                    self.free.append(slot)
                    ok = False
                    continue
                self.index[key] = slot
            self._save_index()
        return ok

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self.index

    def clear(self) -> None:
        with self._lock:
            self.index.clear()
            self.free = list(range(self.num_slots - 1, -1, -1))
            self._save_index()

    def close(self) -> None:
        self.client.close()


@hookimpl
def engine_create_hicache_storage(options: Any, storage_config: Any) -> HiCacheStorage:
    extra = dict(storage_config.extra)
    mock = bool(extra.pop("use_mock_hf3fs_client", False))
    path = str(extra.pop("file_path", options.hicache_hf3fs_file))
    size = int(extra.pop("file_size", 2**30))
    if extra:
        raise PluginError(f"unknown extra config keys for hf3fs: {', '.join(sorted(extra))} "
                          "(it takes use_mock_hf3fs_client, file_path, file_size)")
    if not mock:
        try:
            import hf3fs_fuse.io  # noqa: F401
        except ImportError:
            raise PluginError("needs a 3FS mount and its USRBIO bindings (hf3fs_fuse), or "
                              '{"use_mock_hf3fs_client": true} in the extra config') from None
        raise PluginError("the 3FS USRBIO client path is not built yet; use "
                          '{"use_mock_hf3fs_client": true}')
    try:
        client = MockClient(path, size)
    except OSError as exc:
        raise PluginError(f"cannot open {path}: {exc.strerror or exc}") from None
    return HF3FSStorage(client, path, size, storage_config.page_bytes)
