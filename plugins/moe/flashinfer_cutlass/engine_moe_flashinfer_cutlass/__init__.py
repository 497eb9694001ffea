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
        "needs FlashInfer's cutlass_fused_moe JIT build (SM90 bf16/fp8) and its weight layout; no adapter in this build"
    ),
)
