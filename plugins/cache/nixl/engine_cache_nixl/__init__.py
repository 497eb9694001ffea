"""nixl HiCache storage backend: manifest only."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="nixl",
    family="hicache_storage",
    implementation="engine_cache_nixl.impl",
    description="one file per KV page, moved by NVIDIA NIXL's file plugins (POSIX by default)",
    requires=Requires(packages=("nixl-cu12 | nixl-cu13",), os=("linux",)),
    options=(Option("--hicache-nixl-dir", default="/tmp/engine-hicache-nixl",
                    help="Directory of the NIXL file store (extra config 'path')."),),
)
