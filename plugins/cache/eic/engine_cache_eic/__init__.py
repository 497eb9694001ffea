"""eic HiCache storage backend: listed, not implemented in this build (see the reason)."""

from engine.api import Plugin

plugin = Plugin(
    name="eic",
    family="hicache_storage",
    implementation=None,
    description="Volcano Engine Elastic Instant Cache (managed RDMA KV service)",
    not_implemented="needs the Volcano Engine EIC cloud service and its client library (RDMA/GDR); no public package or local server exists",
)
