"""hf3fs HiCache storage backend: manifest only."""

from engine.api import Option, Plugin

plugin = Plugin(
    name="hf3fs",
    family="hicache_storage",
    implementation="engine_cache_hf3fs.impl",
    description="DeepSeek 3FS: pages at offsets of one large file per server (the real "
                "USRBIO client, or the mock client on a local file)",
    options=(Option("--hicache-hf3fs-file", default="/tmp/engine-hicache-hf3fs/pages.bin",
                    help="The page file (on a 3FS mount with the real client)."),),
)
