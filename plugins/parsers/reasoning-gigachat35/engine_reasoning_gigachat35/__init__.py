"""The gigachat35 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="gigachat35",
    family="reasoning_parser",
    implementation="engine_reasoning_gigachat35.impl",
    description="GigaChat 3.5: <think>...</think>, always forced",
)
