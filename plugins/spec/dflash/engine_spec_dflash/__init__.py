"""dflash (speculative): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="dflash",
    family="speculative",
    implementation=None,
    description="DFLASH speculative decoding: a block-diffusion draft proposes a whole block per forward",
    requires=Requires(devices=("cpu", "cuda")),
    not_implemented=(
        "needs a DFlash block-diffusion draft: its architecture (a few bidirectional layers over a block of mask tokens, with target-layer features injected as extra keys and values) and checkpoint layout are not built here; the core would verify its block as a chain (--speculative-eagle-topk 1) with per-slot target features as EAGLE3 uses, but no draft forward exists to produce the block"
    ),
)
