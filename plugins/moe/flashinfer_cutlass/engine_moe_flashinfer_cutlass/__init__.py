"""flashinfer_cutlass (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer_cutlass',
    family='moe',
    implementation=None,
    description='FlashInfer cutlass_fused_moe (JIT per architecture)',
    requires=Requires(packages=('flashinfer-python',),
                      devices=('cuda',),
                      min_compute_capability=(9, 0)),
    not_implemented=(
        'needs prebuilt FlashInfer cutlass_fused_moe kernels: the SM90 JIT build of FlashInfer 0.5.3 did not finish in 8 minutes on a 16-core H200 host, so no adapter is offered'
    ),
)
