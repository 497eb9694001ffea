"""The ling3 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="ling3",
    family="reasoning_parser",
    implementation="engine_reasoning_ling3.impl",
    description="Ling-3 / BailingMoeV3: <think>...</think>, empty content gets the reasoning",
)
