"""``--hicache-storage-backend shm``: pages as files on the shared-memory file system
(``/dev/shm``), written atomically like the file store; every server of the machine with the
same model reads them. Extra config: ``path``."""

from __future__ import annotations

import os
from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import DirectoryStorage, HiCacheStorage


@hookimpl
def engine_create_hicache_storage(options: Any, storage_config: Any) -> HiCacheStorage:
    extra = dict(storage_config.extra)
    root = str(extra.pop("path", options.hicache_shm_dir))
    if extra:
        raise PluginError(f"unknown extra config keys for shm: {', '.join(sorted(extra))} "
                          "(it takes path)")
    parent = os.path.dirname(root.rstrip("/")) or "/"
    if not os.path.isdir(parent):
        raise PluginError(f"{parent} does not exist: no shared-memory file system here")
    try:
        return DirectoryStorage(root)
    except OSError as exc:
        raise PluginError(f"cannot use {root}: {exc.strerror or exc}") from None
