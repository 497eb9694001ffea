"""mooncake (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='mooncake',
    family='moe_a2a',
    implementation=None,
    description='Mooncake EP (elastic DeepEP extension over RDMA)',
    requires=Requires(packages=('mooncake-transfer-engine',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several GPUs (--ep-size > 1) with RDMA NICs; this build serves one process'
    ),
)
