"""fa3 attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="fa3",
    family="attention",
    implementation=None,
    description="FlashAttention-3 paged attention (Hopper warp-specialized kernels)",
    requires=Requires(packages=("flash-attn-3",),
                      devices=("cuda",),
                      min_compute_capability=(9, 0),
                      max_compute_capability=(9, 0)),
    not_implemented=(
        "needs FlashAttention-3 (flash-attn-3, or the sgl-kernel build of it) on a Hopper GPU"
        " (SM90); no adapter in this build"
    ),
)
