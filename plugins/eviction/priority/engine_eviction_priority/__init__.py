"""priority eviction policy: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="priority",
    family="eviction_policy",
    implementation="engine_eviction_priority.impl",
    description="lowest request priority first (the highest of the requests that reached a prefix), then least recently used",
)
