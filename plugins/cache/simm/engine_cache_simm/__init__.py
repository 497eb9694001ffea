"""simm HiCache storage backend: listed, not implemented in this build (see the reason)."""

from engine.api import Plugin

plugin = Plugin(
    name="simm",
    family="hicache_storage",
    implementation=None,
    description="Scitix In-Memory Middleware (RDMA cluster store)",
    not_implemented="needs a Scitix SiMM cluster (cluster manager + data servers over RDMA, on Kubernetes) and its client built from source; the PyPI package 'simm' is unrelated",
)
