"""deepep_v2 (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='deepep_v2',
    family='moe_a2a',
    implementation=None,
    description='DeepEP v2 ElasticBuffer',
    requires=Requires(packages=('deep_ep',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several GPUs (--ep-size > 1), DeepEP v2 and the deep_gemm runner; this build serves one process'
    ),
)
