"""cutedsl_mla attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="cutedsl_mla",
    family="attention",
    implementation=None,
    description="CuTe-DSL MLA decode kernels",
    requires=Requires(packages=("nvidia-cutlass-dsl",),
                      devices=("cuda",),
                      min_compute_capability=(10, 0),
                      max_compute_capability=(10, 3),
                      model_features=("mla",)),
    not_implemented=(
        "needs CUTLASS CuTe-DSL MLA kernels (nvidia-cutlass-dsl) on a Blackwell GPU (SM100) "
        "and an MLA model, page size 32 or 64; no adapter in this build"
    ),
)
