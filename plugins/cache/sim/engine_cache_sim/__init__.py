"""sim HiCache storage backend: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="sim",
    family="hicache_storage",
    implementation="engine_cache_sim.impl",
    description="in-process pages with simulated latency and bandwidth (no I/O), for "
                "benchmarking the storage tier",
)
