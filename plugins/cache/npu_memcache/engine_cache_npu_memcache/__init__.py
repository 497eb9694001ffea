"""npu_memcache HiCache storage backend: listed, not implemented in this build (see the reason)."""

from engine.api import Plugin

plugin = Plugin(
    name="npu_memcache",
    family="hicache_storage",
    implementation=None,
    description="Ascend MemCache (memcache_hybrid service)",
    not_implemented="needs an Ascend NPU and the memcache-hybrid / memfabric-hybrid service",
)
