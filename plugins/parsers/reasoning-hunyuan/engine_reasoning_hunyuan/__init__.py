"""The hunyuan reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="hunyuan",
    family="reasoning_parser",
    implementation="engine_reasoning_hunyuan.impl",
    description="Tencent Hunyuan HY-V3: <think>...</think> (or suffixed), on with reasoning_effort",
)
