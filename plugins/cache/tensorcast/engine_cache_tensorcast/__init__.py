"""tensorcast HiCache storage backend: listed, not implemented in this build (see the reason)."""

from engine.api import Plugin

plugin = Plugin(
    name="tensorcast",
    family="hicache_storage",
    implementation=None,
    description="tensorcast shared tensor layer (gRPC daemon, RDMA peers)",
    not_implemented="needs the tensorcast package and its store daemon (gRPC, global store, RDMA peers); not integrated yet",
)
