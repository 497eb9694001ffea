"""The minimax-m3 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="minimax-m3",
    family="reasoning_parser",
    implementation="engine_reasoning_minimax_m3.impl",
    description="MiniMax-M3: <mm:think>...</mm:think>, on when thinking_mode=enabled",
)
