"""mori HiCache storage backend: listed, not implemented in this build (see the reason)."""

from engine.api import Plugin

plugin = Plugin(
    name="mori",
    family="hicache_storage",
    implementation=None,
    description="AMD MORI UMBP (DRAM + SSD tiers, ROCm/RDMA)",
    not_implemented="needs AMD mori built with BUILD_UMBP=ON (ROCm/RDMA oriented); no CPU build of it exists here",
)
