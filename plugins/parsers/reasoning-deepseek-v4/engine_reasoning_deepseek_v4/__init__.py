"""The deepseek-v4 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="deepseek-v4",
    family="reasoning_parser",
    implementation="engine_reasoning_deepseek_v4.impl",
    description="DeepSeek-V4: <think>...</think> when thinking=true, DSML tool-start",
)
