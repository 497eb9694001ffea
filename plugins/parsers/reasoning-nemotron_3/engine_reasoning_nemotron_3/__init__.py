"""The nemotron_3 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="nemotron_3",
    family="reasoning_parser",
    implementation="engine_reasoning_nemotron_3.impl",
    description="NVIDIA Nemotron-3: <think>...</think>, on unless enable_thinking=false",
)
