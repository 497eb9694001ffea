"""The dots reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="dots",
    family="reasoning_parser",
    implementation="engine_reasoning_dots.impl",
    description="dots.llm: <think>...</think>, on unless enable_thinking=false",
)
