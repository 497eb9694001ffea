"""The deepseek-r1 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="deepseek-r1",
    family="reasoning_parser",
    implementation="engine_reasoning_deepseek_r1.impl",
    description="DeepSeek-R1: <think>...</think>, always forced",
)
