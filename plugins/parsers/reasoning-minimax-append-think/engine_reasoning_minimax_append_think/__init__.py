"""The minimax-append-think reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="minimax-append-think",
    family="reasoning_parser",
    implementation="engine_reasoning_minimax_append_think.impl",
    description="MiniMax-M2 inline reasoning: prepends <think>, splits nothing",
)
