"""The scheduler's prefix cache, built from the config: the device-only radix cache, or the
hierarchical one with its host pool and storage tier (``--enable-hierarchical-cache``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine.errors import ConfigError
from engine.runtime.hiradix_cache import HiRadixCache
from engine.runtime.host_pool import HostKVPool, Transfer
from engine.runtime.page_store import CORE_KEYS, PageCodec, StorageTier, identity
from engine.runtime.radix_cache import RadixCache

log = logging.getLogger("engine.hicache")

#: layouts and I/O backends the flags list that this build does not have, and why
UNSUPPORTED = {
    "page_first_kv_split": "--hicache-mem-layout page_first_kv_split splits MLA latent and rope "
                           "parts; no served architecture uses MLA",
    "page_head": "--hicache-mem-layout page_head splits heads across tensor-parallel ranks; a "
                 "server here runs one rank",
    "kernel_ascend": "--hicache-io-backend kernel_ascend needs an Ascend NPU",
}


def build_cache(config: Any, runner: Any, allocator: Any, policy: Any = None,
                storage_factory: Callable[[Any], Any] | None = None) -> RadixCache:
    """The scheduler's prefix cache: a :class:`HiRadixCache` with
    ``--enable-hierarchical-cache``, else the device-only :class:`RadixCache`.
    ``storage_factory(storage_config)`` builds the chosen store (None: no storage tier)."""
    from engine.api.hicache import StorageConfig
    from engine.config import load_extra_config

    if not config.enable_hierarchical_cache:
        if config.hicache_storage_backend is not None:
            raise ConfigError(f"--hicache-storage-backend {config.hicache_storage_backend}: "
                              "needs --enable-hierarchical-cache")
        return RadixCache(runner.pool.page_size, allocator.free_slots,
                          disabled=config.disable_radix_cache, policy=policy)
    if config.disable_radix_cache:
        raise ConfigError("--enable-hierarchical-cache keeps radix-cache prefixes; it cannot be "
                          "combined with --disable-radix-cache")
    for value in (config.hicache_mem_layout, config.hicache_io_backend):
        if value in UNSUPPORTED:
            raise ConfigError(UNSUPPORTED[value])
    buffer_only = config.hicache_host_memory_mode == "buffer_only"
    if buffer_only and config.hicache_storage_backend is None:
        raise ConfigError("--hicache-host-memory-mode buffer_only stages pages for a storage "
                          "backend: it needs --hicache-storage-backend")
    pool = runner.pool
    ratio = config.hicache_ratio
    if ratio is None:
        ratio = 1.2 if buffer_only else 2.0
    if config.hicache_size and config.hicache_size > 0:
        tokens = int(config.hicache_size * 1e9 // pool.bytes_per_token)
    elif ratio > 0:
        tokens = int(allocator.capacity_tokens * ratio)
    else:
        raise ConfigError("--hicache-ratio must be positive (or set --hicache-size)")
    available = _available_host_bytes()
    fraction = config.hicache_host_memory_fraction
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ConfigError(f"--hicache-host-memory-fraction {fraction}: must be in (0, 1]")
        limit = _host_memory_limit(available)
        if config.hicache_ratio is None and not config.hicache_size and limit is not None:
            budget = fraction * max(0, limit - HOST_RESERVE_BYTES)
            fits = int(budget // pool.bytes_per_token)
            if fits < tokens:
                log.info("--hicache-host-memory-fraction %g: host pool of %d tokens instead of "
                         "%d (%.1f GiB of %.1f GiB usable)", fraction, fits, tokens,
                         budget / 2**30, limit / 2**30)
                tokens = fits
            if tokens < pool.page_size:
                raise ConfigError(f"--hicache-host-memory-fraction {fraction}: "
                                  f"{budget / 2**20:.0f} MiB of host memory holds no KV page; "
                                  "raise it or set --hicache-size")
    want = tokens * pool.bytes_per_token
    if available is not None and want > 0.9 * available:
        raise ConfigError(f"a host KV pool of {tokens} tokens needs {want / 2**30:.1f} GiB and "
                          f"{available / 2**30:.1f} GiB of host memory is available; lower "
                          "--hicache-ratio or set --hicache-size")
    try:
        host = HostKVPool(pool, tokens, layout=config.hicache_mem_layout,
                          pin=pool.device.type == "cuda")
    except ValueError as exc:
        raise ConfigError(f"--hicache-ratio/--hicache-size: {exc}") from None
    extra = load_extra_config(config.hicache_storage_backend_extra_config)
    core = {k: extra.pop(k) for k in list(extra) if k in CORE_KEYS}
    ident = identity(runner.model_config, pool.format_name, pool.page_size)
    storage = None
    if storage_factory is not None and config.hicache_storage_backend is not None:
        codec = PageCodec(host.payload_bytes)
        store = storage_factory(StorageConfig(
            page_bytes=codec.page_bytes, identity=ident, extra=extra,
            model_name=config.served_model_name or str(runner.model_config.model_path),
            page_first=host.page_first))
        if store is not None:
            storage = StorageTier(store, codec, name=config.hicache_storage_backend)
    if buffer_only and storage is None:
        raise ConfigError(f"--hicache-host-memory-mode buffer_only: the storage backend "
                          f"{config.hicache_storage_backend} built no store")
    if storage is not None and pool.page_size < 16:
        log.warning("--page-size %d: every %d tokens are one storage page (one key, one store "
                    "entry); a larger page size (64) makes the storage tier far cheaper",
                    pool.page_size, pool.page_size)
    transfer = Transfer(pool, host, config.hicache_io_backend)
    log.info("hierarchical cache: host pool %d tokens (%.1f MiB, %s, %s), write policy %s, "
             "%s copies, storage %s", host.capacity_tokens, host.capacity_tokens
             * pool.bytes_per_token / 2**20, config.hicache_mem_layout,
             config.hicache_host_memory_mode, config.hicache_write_policy, transfer.io,
             config.hicache_storage_backend or "none")
    return HiRadixCache(pool.page_size, allocator.free_slots, allocator=allocator, host=host,
                        transfer=transfer,
                        write_policy=config.hicache_write_policy, policy=policy,
                        storage=storage, identity=ident,
                        prefetch_policy=config.hicache_storage_prefetch_policy, prefetch=core,
                        buffer_only=buffer_only)


HOST_RESERVE_BYTES = 10 * 2**30  #: host memory --hicache-host-memory-fraction never counts

#: cgroup limits (v2, then v1) on the memory this process may use
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.high",
                  "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def _host_memory_limit(available: int | None) -> int | None:
    """The host memory the pools may come from: ``available`` (``MemAvailable``), bounded by
    the cgroup's limits where they are set."""
    values = [available] if available is not None else []
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" / a huge number: no limit
            values.append(int(text))
    return min(values) if values else None


def _available_host_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``, or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
