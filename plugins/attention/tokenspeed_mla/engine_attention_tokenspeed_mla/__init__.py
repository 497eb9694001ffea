"""tokenspeed_mla attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="tokenspeed_mla",
    family="attention",
    implementation=None,
    description="TokenSpeed MLA kernels",
    requires=Requires(packages=("tokenspeed-mla",),
                      devices=("cuda",),
                      min_compute_capability=(10, 0),
                      max_compute_capability=(10, 3),
                      model_features=("mla",)),
    not_implemented=(
        "needs the tokenspeed-mla kernels on a Blackwell GPU (SM100), an MLA model and an FP8"
        " KV cache, page size 32 or 64; no adapter in this build"
    ),
)
