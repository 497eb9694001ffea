"""experimental_sgl_marlin (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='experimental_sgl_marlin',
    family='moe',
    implementation=None,
    description='Marlin MoE with MoE-LoRA',
    requires=Requires(packages=('sgl-kernel',),
                      devices=('cuda',),
                      min_compute_capability=(8, 0)),
    not_implemented=(
        "needs sgl-kernel (wheels pin another torch than this build's); no adapter in this build"
    ),
)
