"""The apertus2509 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="apertus2509",
    family="reasoning_parser",
    implementation="engine_reasoning_apertus2509.impl",
    description="Swiss AI Apertus: <|inner_prefix|>...<|inner_suffix|> blocks",
)
