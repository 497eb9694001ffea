"""marlin (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='marlin',
    family='moe',
    implementation=None,
    description='Marlin weight-only MoE (int4/int8/fp4 weights)',
    requires=Requires(packages=('sgl-kernel',),
                      devices=('cuda',),
                      min_compute_capability=(8, 0)),
    not_implemented=(
        "needs sgl-kernel (wheels pin another torch than this build's) and weight-only quantized experts"
    ),
)
