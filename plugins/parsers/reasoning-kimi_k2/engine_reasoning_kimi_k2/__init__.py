"""The kimi_k2 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="kimi_k2",
    family="reasoning_parser",
    implementation="engine_reasoning_kimi_k2.impl",
    description="Kimi-K2: <think>...</think>, tool-section start closes reasoning",
)
