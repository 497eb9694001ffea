"""fa4 attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="fa4",
    family="attention",
    implementation=None,
    description="FlashAttention-4 (CuTe DSL) paged attention",
    requires=Requires(packages=("flash-attn-4", "nvidia-cutlass-dsl"),
                      devices=("cuda",),
                      min_compute_capability=(9, 0),
                      max_compute_capability=(10, 3)),
    not_implemented=(
        "needs FlashAttention-4 (flash-attn-4 + nvidia-cutlass-dsl) on SM90 or SM100 (native "
        "page size 128); no adapter in this build"
    ),
)
