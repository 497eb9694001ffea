"""The gemma4 reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="gemma4",
    family="reasoning_parser",
    implementation="engine_reasoning_gemma4.impl",
    description="Gemma 4: <|channel>thought ... <channel|>, opt-in with enable_thinking=true",
)
