"""file HiCache storage backend: manifest only."""

from engine.api import Option, Plugin

plugin = Plugin(
    name="file",
    family="hicache_storage",
    implementation="engine_cache_file.impl",
    description="one file per KV page in a local (or shared) directory, written atomically",
    priority=10,
    options=(
        Option("--hicache-file-storage-dir", default="/tmp/engine-hicache",
               help="Directory of the file store (extra config 'path' overrides it)."),
        Option("--hicache-file-fsync", type="bool", default=False,
               help="fsync every page before it is published (survives power loss)."),
    ),
)
