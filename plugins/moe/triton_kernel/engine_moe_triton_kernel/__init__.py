"""triton_kernel (moe): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name='triton_kernel',
    family='moe',
    implementation=None,
    description='OpenAI triton_kernels MoE (matmul_ogs, routing)',
    requires=Requires(packages=('triton_kernels',),
                      devices=('cuda',),
                      min_compute_capability=(9, 0)),
    not_implemented=(
        "needs OpenAI's triton_kernels package, published only as a git subdirectory of triton (not on PyPI); no adapter in this build"
    ),
)
