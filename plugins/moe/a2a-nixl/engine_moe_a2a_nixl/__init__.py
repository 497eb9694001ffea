"""nixl (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='nixl',
    family='moe_a2a',
    implementation=None,
    description='NIXL-EP low-latency dispatch over RDMA/NVLink',
    requires=Requires(packages=('nixl',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several GPUs (--ep-size > 1) and NIXL-EP; this build serves one process'
    ),
)
