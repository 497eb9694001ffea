"""pplx (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='pplx',
    family='moe_a2a',
    implementation=None,
    description='pplx-kernels masked low-latency all-to-all (NVSHMEM)',
    requires=Requires(packages=('pplx-kernels',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several SM90 GPUs (dp >= 2, --ep-size > 1), NVSHMEM and the prebuilt pplx kernels; this build serves one process'
    ),
)
