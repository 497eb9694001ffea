"""deep_gemm (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='deep_gemm',
    family='moe',
    implementation=None,
    description='DeepGEMM grouped GEMMs (contiguous prefill, masked decode)',
    requires=Requires(packages=('deep_gemm',),
                      devices=('cuda',),
                      min_compute_capability=(9, 0)),
    not_implemented=(
        "needs a DeepGEMM build for this torch: sgl-deep-gemm 0.2.5's _C.so does not load with torch 2.11 on the H200 (built against another torch), and FP8 block-scaled expert weights"
    ),
)
