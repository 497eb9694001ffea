"""wave attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="wave",
    family="attention",
    implementation=None,
    description="Wave (wave-lang) attention kernels for ROCm",
    requires=Requires(packages=("wave-lang",),
                      devices=("rocm",)),
    not_implemented=(
        "needs the wave-lang kernel DSL and a ROCm GPU; no adapter in this build"
    ),
)
