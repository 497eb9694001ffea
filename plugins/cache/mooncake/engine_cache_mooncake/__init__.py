"""mooncake HiCache storage backend: manifest only."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="mooncake",
    family="hicache_storage",
    implementation="engine_cache_mooncake.impl",
    description="Mooncake distributed KV store (a master + DRAM segments; TCP or RDMA)",
    requires=Requires(packages=("mooncake-transfer-engine | mooncake-transfer-engine-non-cuda",),
                      os=("linux",)),
)
