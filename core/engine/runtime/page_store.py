"""The storage tier of the hierarchical KV cache: page keys, the page codec, and the I/O thread
that talks to the chosen store (:class:`engine.api.hicache.HiCacheStorage`).

* **Keys** are a hash chain: page ``i``'s key is ``sha256(digest_{i-1} || tokens_i)`` with the
  tokens as uint32 little-endian, and ``digest_{-1}`` the model/layout identity
  (:func:`identity`). A key therefore names a page *and its whole prefix*: any server with the
  same model and KV layout computes the same keys for the same tokens.
* **Values** are a 64-byte header (magic, payload length, CRC-32 of the payload, the key's
  digest) and the payload. :meth:`PageCodec.decode` refuses anything short, long, corrupted or
  stored under another key; the pages from there on are a miss and get recomputed.
* **One I/O thread** runs every store call in order, off the scheduler thread: writes queued by
  backups, and fetches queued when a request arrives (a fetch queued after a write of the same
  page sees it). A store that raises or is slow costs hits, never a request: errors are logged
  and counted, and admission waits for a fetch at most as long as
  ``--hicache-storage-prefetch-policy`` allows.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.api.hicache import PAGE_HEADER_BYTES

log = logging.getLogger("engine.hicache")

MAGIC = b"ENGKVPG1"
_HEADER = struct.Struct("<8sQI32s")  # magic, payload length, crc32, key digest
BATCH_PAGES = 128  #: most pages per store call
#: extra-config keys the core reads (the rest goes to the backend), with their defaults
CORE_KEYS = {"prefetch_threshold": 256, "prefetch_timeout_base": 2.0,
             "prefetch_timeout_per_ki_token": 0.1, "prefetch_timeout_max": 30.0}


def identity(model_config: Any, dtype: Any, page_size: int) -> str:
    """Hex digest of what makes two servers' pages interchangeable: the model, the KV geometry,
    the dtype and the page size."""
    parts = [getattr(model_config, "architecture", ""), getattr(model_config, "model_path", ""),
             model_config.num_hidden_layers, model_config.num_key_value_heads,
             model_config.head_dim, str(dtype), page_size]
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def page_keys(tokens: Sequence[int], page_size: int, prev: str) -> list[str]:
    """Keys of the whole pages of ``tokens``, chained from ``prev`` (a key, or the identity)."""
    keys, digest = [], bytes.fromhex(prev)
    for at in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = hashlib.sha256(digest)
        h.update(struct.pack(f"<{page_size}I", *tokens[at:at + page_size]))
        digest = h.digest()
        keys.append(digest.hex())
    return keys


class PageCodec:
    """Header + payload; see the module docstring."""

    def __init__(self, payload_bytes: int) -> None:
        self.payload_bytes = payload_bytes
        self.page_bytes = PAGE_HEADER_BYTES + payload_bytes

    def encode(self, key: str, payload: Any) -> bytearray:
        data = memoryview(payload).cast("B")
        blob = bytearray(self.page_bytes)
        _HEADER.pack_into(blob, 0, MAGIC, len(data), zlib.crc32(data), bytes.fromhex(key))
        blob[PAGE_HEADER_BYTES:] = data
        return blob

    def decode(self, key: str, blob: Any) -> memoryview | None:
        """The payload of ``blob`` if it is whole, intact and ``key``'s; else None."""
        if blob is None:
            return None
        data = memoryview(blob).cast("B")
        if len(data) != self.page_bytes:
            return None
        magic, length, crc, digest = _HEADER.unpack_from(data, 0)
        payload = data[PAGE_HEADER_BYTES:]
        if (magic != MAGIC or length != self.payload_bytes or digest != bytes.fromhex(key)
                or zlib.crc32(payload) != crc):
            return None
        return payload


@dataclass(eq=False)
class Fetch:
    """Pages being read from storage for one arriving prompt: ``tokens`` (page-aligned), the
    first ``start`` of which the tree already held when it was queued, and ``keys`` of the
    pages from there. ``payloads`` (the leading pages found intact) is valid once ``done``."""

    tokens: list[int]
    start: int
    keys: list[str]
    payloads: list[Any] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.monotonic)
    #: when something first waited for the answer (the prefetch policy's budget counts from it)
    wait_from: float | None = None


@dataclass
class StorageStats:
    pages_read: int = 0
    pages_written: int = 0
    misses: int = 0
    corrupt: int = 0
    errors: int = 0
    write_failures: int = 0


class StorageTier:
    """The store behind the host pool, used through one I/O thread."""

    def __init__(self, store: Any, codec: PageCodec, name: str = "storage") -> None:
        self.store, self.codec, self.name = store, codec, name
        self.stats = StorageStats()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="engine-hicache-io",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ scheduler side

    def write(self, keys: list[str], blobs: list[bytearray]) -> None:
        """Queue pages to store (those already stored are skipped)."""
        if keys and not self._closed:
            self._queue.put(("write", (keys, blobs)))

    def fetch(self, tokens: list[int], start: int, keys: list[str]) -> Fetch:
        """Queue a read of ``keys`` (the pages of ``tokens`` from ``start`` on)."""
        f = Fetch(tokens, start, keys)
        if self._closed:
            f.done.set()
        else:
            self._queue.put(("fetch", f))
        return f

    def close(self, timeout: float = 30.0) -> None:
        """Finish the queued writes (at most ``timeout`` seconds), then close the store."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(("stop", None))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s: queued writes did not finish in %.0f s; some pages are not stored",
                        self.name, timeout)
            return
        try:
            self.store.close()
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.warning("%s: close failed: %s", self.name, exc)

    # ------------------------------------------------------------------ I/O thread

    def _loop(self) -> None:
        while True:
            kind, arg = self._queue.get()
            if kind == "stop":
                return
            try:
                if kind == "write":
                    self._write(*arg)
                else:
                    self._fetch(arg)
            except Exception as exc:  # noqa: BLE001 - a store failure is a miss, never fatal
                self.stats.errors += 1
                log.warning("%s: %s failed (%s: %s); the pages are recomputed instead",
                            self.name, kind, type(exc).__name__, exc)
            finally:
                if kind == "fetch":
                    arg.done.set()

    def _write(self, keys: list[str], blobs: list[bytearray]) -> None:
        for at in range(0, len(keys), BATCH_PAGES):
            ks, bs = keys[at:at + BATCH_PAGES], blobs[at:at + BATCH_PAGES]
            todo = [(k, b) for k, b in zip(ks, bs) if not self.store.exists(k)]
            if not todo:
                continue
            ok = self.store.batch_set([k for k, _ in todo], [b for _, b in todo])
            if ok:
                self.stats.pages_written += len(todo)
            else:
                self.stats.write_failures += len(todo)
                log.warning("%s: storing %d pages failed; they stay in the faster tiers only",
                            self.name, len(todo))

    def _fetch(self, f: Fetch) -> None:
        n = self.store.batch_exists(f.keys)
        self.stats.misses += len(f.keys) - n
        for at in range(0, n, BATCH_PAGES):
            keys = f.keys[at:min(n, at + BATCH_PAGES)]
            size = self.codec.page_bytes  # one buffer for the batch: a store may register it
            arena = memoryview(bytearray(size * len(keys)))
            targets = [arena[i * size:(i + 1) * size] for i in range(len(keys))]
            got = self.store.batch_get(keys, targets)
            for key, target, blob in zip(keys, targets, got or []):
                payload = self.codec.decode(key, blob)
                if payload is None:
                    if blob is not None:
                        self.stats.corrupt += 1
                        log.warning("%s: page %s is short or corrupted; recomputing it",
                                    self.name, key[:16])
                    return
                f.payloads.append(payload)
                self.stats.pages_read += 1
            if len(got or []) < len(keys):
                return
