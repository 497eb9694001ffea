"""flashmla attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="flashmla",
    family="attention",
    implementation=None,
    description="FlashMLA decode for multi-head latent attention",
    requires=Requires(packages=("flash-mla",),
                      devices=("cuda",),
                      min_compute_capability=(9, 0),
                      max_compute_capability=(10, 3),
                      model_features=("mla",)),
    not_implemented=(
        "needs DeepSeek's FlashMLA kernels (flash_mla) on SM90/SM100 and an MLA model "
        "(DeepSeek-V2/V3 family), page size 64; no adapter in this build"
    ),
)
