"""The deepseek-v41 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="deepseek-v41",
    family="reasoning_parser",
    implementation="engine_reasoning_deepseek_v41.impl",
    description="DeepSeek-V4.1: <think>...</think> when thinking=true, DSML tool-start",
)
