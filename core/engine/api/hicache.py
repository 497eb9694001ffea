"""The hicache_storage family's interface (hook ``engine_create_hicache_storage``).

A store keeps KV pages behind the host tier of the hierarchical cache
(``--enable-hierarchical-cache``). The core decides what a page is and checks it; a store only
keeps bytes under keys:

* **Keys** are 64 lower-case hex characters: ``sha256(previous page's digest || page token ids
  as uint32 little-endian)``; the first page chains from a digest of the model and KV layout
  identity (:attr:`StorageConfig.identity`), so equal prefixes of one model and layout share
  keys across requests, restarts and servers, and different models never do.
* **Values** are one page each: a header written by the core (magic, length, CRC-32 of the
  payload, the key's digest) followed by the page's K/V bytes. Every value handed to
  :meth:`HiCacheStorage.set` of one store has the same length (:attr:`StorageConfig.page_bytes`).
  The core verifies what comes back: a value that is short, long, fails its checksum or names
  another key is a miss, recomputed and never served. A store therefore never has to check
  integrity itself; it must only never *report* a value as present that it cannot return.
* **Threads**: the core calls a store from one I/O thread of its own (never the scheduler
  thread), so a slow store delays cache hits, never decoding. A store may still be called from
  several threads by tools (the conformance kit's concurrent writers): methods must be safe to
  call concurrently.
* **Failures**: a method may raise; the core logs it, counts it and treats the pages as
  missing (recompute). A request never fails because of its store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: bytes of the header the core writes in front of every page's payload
PAGE_HEADER_BYTES = 64


@dataclass(frozen=True)
class StorageConfig:
    """What a store is told when it is built.

    :param page_bytes: the length of every value (header included)
    :param identity: hex digest of the model and KV layout the keys belong to (a store may use
        it as a namespace: a directory or key prefix)
    :param model_name: the served model's name (for logs and namespaces)
    :param extra: the backend's part of ``--hicache-storage-backend-extra-config`` (the keys the
        core reads itself, such as ``prefetch_threshold``, removed)
    :param page_first: whether a page's payload is one contiguous run of the host pool
        (``--hicache-mem-layout page_first``/``page_first_direct``), which a zero-copy store
        may rely on
    """

    page_bytes: int
    identity: str = ""
    model_name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    page_first: bool = False


class HiCacheStorage(ABC):
    """Page-granular KV storage. Keys are hex strings; values are bytes-like pages."""

    @abstractmethod
    def get(self, key: str, target: Any = None) -> Any | None:
        """The page stored under ``key``, or ``None`` when it is not stored.

        ``target``, when given, is a writable buffer (``memoryview`` of ``page_bytes`` bytes):
        a store that can read straight into it does so and returns it (zero copy); any other
        bytes-like return value is copied by the core.
        """

    @abstractmethod
    def set(self, key: str, value: Any) -> bool:
        """Store one page (a bytes-like object); ``True`` when stored (an existing key may be
        kept as it is). A write that fails or is interrupted must leave either the old value or
        nothing under ``key``, never part of the new one (write elsewhere, then rename)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored."""

    def batch_get(self, keys: Sequence[str], targets: Sequence[Any] | None = None) -> list:
        """:meth:`get` for each key, ``None`` for the missing ones (a partial batch); a backend
        may do it in one round trip. The core's ``targets`` are consecutive slices of one
        buffer (a store that registers memory with its transport can register it once)."""
        return [self.get(k, t) for k, t in zip(keys, targets or [None] * len(keys))]

    def batch_set(self, keys: Sequence[str], values: Sequence[Any]) -> bool:
        """:meth:`set` for each pair; ``True`` when all were stored."""
        return all([self.set(k, v) for k, v in zip(keys, values)])

    def batch_exists(self, keys: Sequence[str]) -> int:
        """How many *leading* keys are stored: a prefix hit stops at the first miss."""
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def clear(self) -> None:
        """Forget every page (optional; tools and tests)."""

    def close(self) -> None:
        """Release connections and files (called once when the server stops)."""


class DirectoryStorage(HiCacheStorage):
    """One file per page in a directory (shared by the ``file`` and ``shm`` stores).

    Writes go to a temporary file in the same directory, then ``os.replace`` it under the key's
    name: a crash or a full disk mid-write leaves a stray temporary file (never read, removed
    at the next start when older than an hour), never a torn page under a key. ``fsync`` makes
    a stored page survive a power loss too (slower).
    """

    TMP_SUFFIX = ".tmp"

    def __init__(self, root: str, *, fsync: bool = False) -> None:
        self.root, self.fsync = root, fsync
        os.makedirs(root, exist_ok=True)
        cutoff = time.time() - 3600
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if name.endswith(self.TMP_SUFFIX) and os.path.getmtime(path) < cutoff:
                with _suppress_oserror():
                    os.unlink(path)

    def _path(self, key: str) -> str:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"not a page key: {key!r}")
        return os.path.join(self.root, key + ".kv")

    def get(self, key: str, target: Any = None) -> Any | None:
        try:
            with open(self._path(key), "rb", buffering=0) as fh:
                if target is None:
                    return fh.read()
                n = fh.readinto(target)
                if fh.read(1):
                    return None  # longer than a page: not one of ours
                return target[:n]
        except FileNotFoundError:
            return None

    def set(self, key: str, value: Any) -> bool:
        path = self._path(key)
        if os.path.exists(path):
            return True
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}{self.TMP_SUFFIX}"
        try:
            with open(tmp, "wb", buffering=0) as fh:
                view = memoryview(value).cast("B")
                while view:
                    view = view[fh.write(view):]
                if self.fsync:
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
            return True
        except OSError as exc:
            logging.getLogger("engine.hicache").warning(
                "storing page %s in %s failed: %s", key[:16], self.root, exc.strerror or exc)
            with _suppress_oserror():
                os.unlink(tmp)
            return False

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def clear(self) -> None:
        for name in os.listdir(self.root):
            if name.endswith(".kv"):
                with _suppress_oserror():
                    os.unlink(os.path.join(self.root, name))


def _suppress_oserror() -> Any:
    return contextlib.suppress(OSError)
