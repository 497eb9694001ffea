"""megamoe (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='megamoe',
    family='moe',
    implementation=None,
    description='DeepGEMM Mega MoE (fused dispatch + GEMMs + combine)',
    requires=Requires(packages=('deep_gemm',),
                      devices=('cuda',),
                      min_compute_capability=(10, 0)),
    not_implemented=(
        "needs several GPUs (expert parallelism with symmetric memory, SM100 first) and DeepGEMM's Mega MoE; an alias of runner auto + all-to-all megamoe"
    ),
)
