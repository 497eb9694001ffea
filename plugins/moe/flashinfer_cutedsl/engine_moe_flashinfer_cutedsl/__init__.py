"""flashinfer_cutedsl (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='flashinfer_cutedsl',
    family='moe',
    implementation=None,
    description='FlashInfer CuTe-DSL NVFP4 MoE',
    requires=Requires(packages=('flashinfer-python', 'nvidia-cutlass-dsl'),
                      devices=('cuda',),
                      min_compute_capability=(10, 0)),
    not_implemented=(
        'needs SM100 (Blackwell), nvidia-cutlass-dsl and NVFP4 expert weights'
    ),
)
