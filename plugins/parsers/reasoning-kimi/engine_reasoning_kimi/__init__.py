"""The kimi reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="kimi",
    family="reasoning_parser",
    implementation="engine_reasoning_kimi.impl",
    description="Kimi (k1.5 / VL): ◁think▷...◁/think▷, never forced",
)
