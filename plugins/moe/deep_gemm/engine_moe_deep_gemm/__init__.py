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
        'needs DeepGEMM (PyPI sgl-deep-gemm, CUDA 13, built against one torch version) and FP8 block-scaled expert weights; no adapter in this build'
    ),
)
