"""megamoe (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='megamoe',
    family='moe_a2a',
    implementation=None,
    description='DeepGEMM Mega MoE fused dispatch/combine',
    requires=Requires(packages=('deep_gemm',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several GPUs with symmetric memory (--ep-size > 1, SM100 first); this build serves one process'
    ),
)
