"""The muse reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.plugins import Plugin

plugin = Plugin(
    name="muse",
    family="reasoning_parser",
    implementation="engine_reasoning_muse.impl",
    description="Muse Glimmer: to=self channels are reasoning, to=user content",
)
