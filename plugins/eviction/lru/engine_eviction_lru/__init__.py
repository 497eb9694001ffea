"""lru eviction policy: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="lru",
    family="eviction_policy",
    implementation="engine_eviction_lru.impl",
    description="least recently used first",
)
