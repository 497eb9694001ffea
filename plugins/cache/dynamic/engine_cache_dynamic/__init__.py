"""dynamic HiCache storage backend: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="dynamic",
    family="hicache_storage",
    implementation="engine_cache_dynamic.impl",
    description="any HiCacheStorage class, named by module_path and class_name in "
                "--hicache-storage-backend-extra-config",
)
