"""aiter (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='aiter',
    family='moe',
    implementation=None,
    description='AMD AITER fused MoE',
    requires=Requires(packages=('aiter',),
                      devices=('rocm',)),
    not_implemented=(
        "needs a ROCm GPU (MI300/MI350 class) and AMD's aiter package"
    ),
)
