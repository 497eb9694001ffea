"""lfu eviction policy: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="lfu",
    family="eviction_policy",
    implementation="engine_eviction_lfu.impl",
    description="fewest hits first, then least recently used",
)
