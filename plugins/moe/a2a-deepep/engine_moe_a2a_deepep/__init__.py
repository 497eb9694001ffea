"""deepep (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='deepep',
    family='moe_a2a',
    implementation=None,
    description='DeepEP normal/low-latency dispatch and combine (NVSHMEM)',
    requires=Requires(packages=('deep_ep',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several GPUs (--ep-size > 1) over NVLink/RDMA, DeepEP and NVSHMEM; this build serves one process'
    ),
)
