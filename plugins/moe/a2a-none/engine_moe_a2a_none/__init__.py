"""none all-to-all: manifest only."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="none",
    family="moe_a2a",
    implementation="engine_moe_a2a_none.impl",
    description="every expert on this rank (expert parallelism 1): no token movement",
    requires=Requires(devices=("cpu", "cuda")),
)
