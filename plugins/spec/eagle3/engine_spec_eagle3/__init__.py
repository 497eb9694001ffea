"""EAGLE3 speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="eagle3",
    family="speculative",
    implementation="engine_spec_eagle3.impl",
    description="EAGLE-3 draft head: fc(3H->H) over three target layers' hidden states, a "
                "midlayer, its own draft-vocabulary LM head mapped to target ids by d2t",
    requires=Requires(packages=("engine-spec-eagle", "safetensors"), devices=("cpu", "cuda")),
)
