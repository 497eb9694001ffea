"""The minimax reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="minimax",
    family="reasoning_parser",
    implementation="engine_reasoning_minimax.impl",
    description="MiniMax-M1/M2: <think>...</think>, always forced",
)
