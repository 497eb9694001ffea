"""auto model-config parser (manifest only)."""

from engine.api import Plugin

plugin = Plugin(
    name="auto",
    family="model_config_parser",
    implementation="engine_model_config_auto.impl",
    description="mistral when the path looks like a Mistral-native checkpoint (params.json, no "
    "config.json), else hf",
)
