"""shm HiCache storage backend: manifest only."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="shm",
    family="hicache_storage",
    implementation="engine_cache_shm.impl",
    description="KV pages in POSIX shared memory (/dev/shm): shared by the servers of one "
                "machine, gone at reboot",
    requires=Requires(os=("linux",)),
    options=(Option("--hicache-shm-dir", default="/dev/shm/engine-hicache",
                    help="Directory on a tmpfs holding the pages (extra config 'path')."),),
)
