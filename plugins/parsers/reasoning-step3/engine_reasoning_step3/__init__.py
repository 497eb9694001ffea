"""The step3 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="step3",
    family="reasoning_parser",
    implementation="engine_reasoning_step3.impl",
    description="StepFun Step-3: <think>...</think>, always forced",
)
