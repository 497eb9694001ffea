"""The step3p5 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="step3p5",
    family="reasoning_parser",
    implementation="engine_reasoning_step3p5.impl",
    description="StepFun Step-3.5: <think>...</think>, always forced",
)
