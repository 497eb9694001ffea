"""The glm45 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="glm45",
    family="reasoning_parser",
    implementation="engine_reasoning_glm45.impl",
    description="GLM-4.5/4.6/4.7/5: <think>...</think>, on unless enable_thinking=false",
)
