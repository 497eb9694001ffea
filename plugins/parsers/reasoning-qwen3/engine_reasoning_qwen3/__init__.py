"""The qwen3 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="qwen3",
    family="reasoning_parser",
    implementation="engine_reasoning_qwen3.impl",
    description="Qwen3 / QwQ: <think>...</think>, on unless enable_thinking=false",
)
