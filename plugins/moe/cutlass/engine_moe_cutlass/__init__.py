"""cutlass (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='cutlass',
    family='moe',
    implementation=None,
    description='sgl-kernel CUTLASS grouped GEMM (FP8, W4A8)',
    requires=Requires(packages=('sgl-kernel',),
                      devices=('cuda',),
                      min_compute_capability=(9, 0)),
    not_implemented=(
        "needs sgl-kernel, whose wheels pin another torch than this build's, and FP8 or W4A8 expert weights"
    ),
)
