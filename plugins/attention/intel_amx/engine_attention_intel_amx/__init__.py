"""intel_amx attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="intel_amx",
    family="attention",
    implementation=None,
    description="Intel AMX CPU attention kernels",
    requires=Requires(packages=("sgl-kernel",),
                      devices=("cpu",),
                      cpu_features=("amx_tile", "amx_bf16")),
    not_implemented=(
        "needs a CPU with AMX (amx_tile, amx_bf16: Sapphire Rapids or newer) and the CPU "
        "build of sgl-kernel; no adapter in this build"
    ),
)
