"""EAGLE speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="eagle",
    family="speculative",
    implementation="engine_spec_eagle.impl",
    description="EAGLE draft head (fc(2H->H) + one decoder layer over the target's embeddings, "
                "features and LM head) from --speculative-draft-model-path; chains, or top-k "
                "siblings along the chain",
    requires=Requires(packages=("safetensors",), devices=("cpu", "cuda")),
)
