"""The k2_horizon reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="k2_horizon",
    family="reasoning_parser",
    implementation="engine_reasoning_k2_horizon.impl",
    description="K2 Horizon (IFM): <ifm|think...> pairs chosen by reasoning_effort, always forced",
)
