"""humming (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='humming',
    family='moe',
    implementation=None,
    description='humming-kernels JIT GEMMs for low-bit expert weights',
    requires=Requires(packages=('humming-kernels',),
                      devices=('cuda',),
                      min_compute_capability=(7, 5)),
    not_implemented=(
        'serves only quantized (<= 8-bit) expert weights, which this build does not load for routed experts yet (humming-kernels 0.1.20 imports on the H200 with torch 2.11); needs nvcc'
    ),
)
