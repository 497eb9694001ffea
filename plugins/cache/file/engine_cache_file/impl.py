"""``--hicache-storage-backend file``: a directory of page files (see
:class:`engine.api.hicache.DirectoryStorage` for the atomic writes). Extra config: ``path``
(directory), ``fsync`` (bool)."""

from __future__ import annotations

from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import DirectoryStorage, HiCacheStorage


@hookimpl
def engine_create_hicache_storage(options: Any, storage_config: Any) -> HiCacheStorage:
    extra = dict(storage_config.extra)
    root = str(extra.pop("path", options.hicache_file_storage_dir))
    fsync = bool(extra.pop("fsync", options.hicache_file_fsync))
    if extra:
        raise PluginError(f"unknown extra config keys for file: {', '.join(sorted(extra))} "
                          "(it takes path, fsync)")
    try:
        return DirectoryStorage(root, fsync=fsync)
    except OSError as exc:
        raise PluginError(f"cannot use directory {root}: {exc.strerror or exc}") from None
