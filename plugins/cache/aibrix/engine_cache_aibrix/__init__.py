"""aibrix HiCache storage backend: listed, not implemented in this build (see the reason)."""

from engine.api import Plugin

plugin = Plugin(
    name="aibrix",
    family="hicache_storage",
    implementation=None,
    description="AIBrix KVCache offloading over InfiniStore or PrisKV",
    not_implemented="needs aibrix-kvcache and a running InfiniStore (RDMA-oriented) or PrisKV (not open source) server; not built against this store interface yet",
)
