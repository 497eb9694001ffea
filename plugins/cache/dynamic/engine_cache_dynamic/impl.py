"""``--hicache-storage-backend dynamic``: imports ``module_path`` and builds
``class_name(storage_config)`` (the :class:`engine.api.hicache.StorageConfig`, whose ``extra``
holds the remaining keys). The class must implement :class:`engine.api.hicache.HiCacheStorage`
(or at least ``get``, ``set`` and ``exists`` with its semantics)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from engine.api import PluginError, hookimpl
from engine.api.hicache import HiCacheStorage

REQUIRED = ("get", "set", "exists", "batch_get", "batch_set", "batch_exists")


@hookimpl
def engine_create_hicache_storage(storage_config: Any) -> Any:
    extra = dict(storage_config.extra)
    module_path, class_name = extra.pop("module_path", None), extra.pop("class_name", None)
    extra.pop("backend_name", None)
    if not module_path or not class_name:
        raise PluginError("dynamic needs module_path and class_name in "
                          "--hicache-storage-backend-extra-config")
    try:
        cls = getattr(importlib.import_module(module_path), class_name)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"cannot load {module_path}.{class_name}: {exc}") from None
    store = cls(dataclasses.replace(storage_config, extra=extra))
    if not isinstance(store, HiCacheStorage):
        missing = [m for m in REQUIRED if not callable(getattr(store, m, None))]
        if missing:
            raise PluginError(f"{module_path}.{class_name} is not a HiCacheStorage (no "
                              f"{', '.join(missing)})")
    return store
