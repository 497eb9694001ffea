"""The iquest_q1 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="iquest_q1",
    family="reasoning_parser",
    implementation="engine_reasoning_iquest_q1.impl",
    description="IQuest Q1: <think>...</think>, forced unless thinking/enable_thinking is false",
)
