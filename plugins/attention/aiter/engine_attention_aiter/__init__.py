"""aiter attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="aiter",
    family="attention",
    implementation=None,
    description="AMD AITER attention kernels (ROCm)",
    requires=Requires(packages=("aiter",),
                      devices=("rocm",)),
    not_implemented=(
        "needs AMD's AITER kernels (aiter) and a ROCm GPU (MI300/MI350 class); no adapter in "
        "this build"
    ),
)
