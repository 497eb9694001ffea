"""tlru eviction policy: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="tlru",
    family="eviction_policy",
    implementation="engine_eviction_tlru.impl",
    description="tail-optimized LRU: the tail of a conversation that its next turn can recompute within the threshold goes first, then least recently used",
)
