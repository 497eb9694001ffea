"""The poolside_v1 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="poolside_v1",
    family="reasoning_parser",
    implementation="engine_reasoning_poolside_v1.impl",
    description="poolside Laguna: <think>...</think>, opt-in with enable_thinking=true",
)
