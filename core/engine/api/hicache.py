"""The hicache_storage family's interface (hook ``engine_create_hicache_storage``).

The family is declared and its plugins listed; the runtime has no host KV tier yet, so choosing
one at ``engine serve`` is refused until it has. A store keeps KV pages keyed by the page's
prefix hash (``sha256(previous page's key || page token ids as uint32 LE)``, hex), so equal
prefixes share keys across requests and servers of the same model and layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence


class HiCacheStorage(ABC):
    """Page-granular KV storage. Keys are hex strings; values are one page's K/V bytes."""

    @abstractmethod
    def get(self, key: str, target: Any = None) -> Any | None:
        """The page stored under ``key`` (into ``target`` when given), or ``None``."""

    @abstractmethod
    def set(self, key: str, value: Any) -> bool:
        """Store one page; ``True`` when stored (an existing key may be kept as is)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored."""

    def batch_get(self, keys: Sequence[str], targets: Sequence[Any] | None = None) -> list:
        """:meth:`get` for each key (a backend may do it in one round trip)."""
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
