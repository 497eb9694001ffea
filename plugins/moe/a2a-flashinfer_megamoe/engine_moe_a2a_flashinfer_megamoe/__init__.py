"""flashinfer_megamoe (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer_megamoe',
    family='moe_a2a',
    implementation=None,
    description='flashinfer.megamoe fused dispatch/combine',
    requires=Requires(packages=('flashinfer-python>=0.7',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several NVLink-connected Hopper GPUs (--ep-size > 1) and FlashInfer 0.7; this build serves one process'
    ),
)
