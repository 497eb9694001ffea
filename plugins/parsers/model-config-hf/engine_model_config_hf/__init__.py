"""hf model-config parser (manifest only)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="hf",
    family="model_config_parser",
    implementation="engine_model_config_hf.impl",
    description="config.json through transformers' AutoConfig, or the metadata of a .gguf file",
    requires=Requires(packages=("transformers", "gguf"), devices=("cpu", "cuda")),
    priority=10,
)
