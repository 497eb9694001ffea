"""mistral model-config parser (manifest only)."""

from engine.api import Plugin

plugin = Plugin(
    name="mistral",
    family="model_config_parser",
    implementation="engine_model_config_mistral.impl",
    description="Mistral's native params.json layout (dim, n_layers, n_heads, n_kv_heads, ...)",
)
