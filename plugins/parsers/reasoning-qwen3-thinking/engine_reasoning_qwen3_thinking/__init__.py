"""The qwen3-thinking reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="qwen3-thinking",
    family="reasoning_parser",
    implementation="engine_reasoning_qwen3_thinking.impl",
    description="Qwen3 Thinking-2507: <think>...</think>, always forced",
)
