"""slru eviction policy: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="slru",
    family="eviction_policy",
    implementation="engine_eviction_slru.impl",
    description="segmented LRU: probationary prefixes (fewer hits than protected_threshold) first, then least recently used",
)
