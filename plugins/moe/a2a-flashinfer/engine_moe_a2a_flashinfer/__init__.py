"""flashinfer (moe_a2a): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer',
    family='moe_a2a',
    implementation=None,
    description='FlashInfer all-to-all for its MoE runners',
    requires=Requires(packages=('flashinfer-python',),
                      devices=('cuda',)),
    not_implemented=(
        'needs several GPUs with data-parallel attention (dp = tp = ep > 1) and a flashinfer_cutlass/cutedsl/trtllm_routed runner; this build serves one process'
    ),
)
