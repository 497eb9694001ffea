"""The deepseek-v3 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="deepseek-v3",
    family="reasoning_parser",
    implementation="engine_reasoning_deepseek_v3.impl",
    description="DeepSeek V3.1/V3.2 hybrid: <think>...</think> when thinking=true",
)
