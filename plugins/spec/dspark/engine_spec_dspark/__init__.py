"""DSPARK speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="dspark",
    family="speculative",
    implementation="engine_spec_dspark.impl",
    description="DSpark semi-autoregressive draft: a DFlash backbone drafts a block in one "
                "forward, a light Markov head corrects each position's logits by the token "
                "drafted before it; static verify of the whole block as a chain",
    requires=Requires(packages=("safetensors",), devices=("cpu", "cuda")),
    options=(
        Option("--speculative-dspark-block-size", "int", None,
               "Draft block size gamma (the number of proposed draft tokens); the verify "
               "window is gamma + 1 (default: --speculative-num-draft-tokens - 1, else the "
               "checkpoint's block_size)."),
    ),
)
