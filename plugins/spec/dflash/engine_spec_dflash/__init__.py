"""DFLASH speculative decoding (manifest only; the implementation loads on selection)."""

from engine.api import Option, Plugin, Requires

plugin = Plugin(
    name="dflash",
    family="speculative",
    implementation="engine_spec_dflash.impl",
    description="DFlash block-diffusion draft (a few non-causal layers over a block of mask "
                "tokens, the target's layer features injected as keys and values): one draft "
                "forward proposes a whole block, verified as a chain",
    requires=Requires(packages=("safetensors",), devices=("cpu", "cuda")),
    options=(
        Option("--speculative-dflash-block-size", "int", None,
               "Tokens per verify: the last token and block size - 1 drafts (default: "
               "--speculative-num-draft-tokens, else the checkpoint's block_size)."),
    ),
)
