"""The mimo reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="mimo",
    family="reasoning_parser",
    implementation="engine_reasoning_mimo.impl",
    description="Xiaomi MiMo: <think>...</think>, opt-in with enable_thinking=true",
)
