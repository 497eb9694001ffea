"""The gpt-oss reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="gpt-oss",
    family="reasoning_parser",
    implementation="engine_reasoning_gpt_oss.impl",
    description="gpt-oss (Harmony): analysis channel is reasoning, final is content",
)
