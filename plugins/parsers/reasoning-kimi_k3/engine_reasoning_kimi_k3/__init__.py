"""The kimi_k3 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="kimi_k3",
    family="reasoning_parser",
    implementation="engine_reasoning_kimi_k3.impl",
    description="Kimi K3 (XTML): think channel is reasoning, response channel is content",
)
