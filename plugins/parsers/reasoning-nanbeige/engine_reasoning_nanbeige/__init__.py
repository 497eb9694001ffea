"""The nanbeige reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="nanbeige",
    family="reasoning_parser",
    implementation="engine_reasoning_nanbeige.impl",
    description="Nanbeige 4.2: <think>...</think> as Qwen3, thinking on by default",
)
