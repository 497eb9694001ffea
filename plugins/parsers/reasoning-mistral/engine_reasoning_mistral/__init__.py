"""The mistral reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Plugin

plugin = Plugin(
    name="mistral",
    family="reasoning_parser",
    implementation="engine_reasoning_mistral.impl",
    description="Mistral (Magistral, Small-4): [THINK]...[/THINK], on with reasoning_effort",
)
