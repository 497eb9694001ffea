"""STANDALONE speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="standalone",
    family="speculative",
    implementation="engine_spec_standalone.impl",
    description="A separate small causal LM with the target's tokenizer drafts a chain (or, "
                "with --speculative-eagle-topk > 1, a chain with top-k siblings); own KV pool",
    requires=Requires(devices=("cpu", "cuda")),
)
