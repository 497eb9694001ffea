"""hpc_ops (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='hpc_ops',
    family='moe',
    implementation=None,
    description='Tencent HPC-Ops FP8 fused MoE',
    requires=Requires(packages=('hpc_ops',),
                      devices=('cuda',),
                      min_compute_capability=(9, 0)),
    not_implemented=(
        'needs Tencent HPC-Ops, which is not published as a package, and FP8 expert weights'
    ),
)
