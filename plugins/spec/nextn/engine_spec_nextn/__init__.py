"""NEXTN speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="nextn",
    family="speculative",
    implementation="engine_spec_nextn.impl",
    description="Alias of EAGLE (as in the reference CLI); also reads a multi-token-prediction "
                "module exported alone (enorm, hnorm, eh_proj, one Llama-style layer, "
                "shared_head.norm)",
    requires=Requires(packages=("engine-spec-eagle", "safetensors"), devices=("cpu", "cuda")),
)
