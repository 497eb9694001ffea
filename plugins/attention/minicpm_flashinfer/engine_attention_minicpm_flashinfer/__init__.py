"""minicpm_flashinfer attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="minicpm_flashinfer",
    family="attention",
    implementation=None,
    description="MiniCPM sparse attention over FlashInfer kernels",
    requires=Requires(packages=("flashinfer-python",),
                      devices=("cuda",),
                      min_compute_capability=(8, 0),
                      model_features=("minicpm_sparse_attention",)),
    not_implemented=(
        "needs a MiniCPM model with sparse attention (MiniCPM4 / MiniCPM-SALA) and "
        "flashinfer-python on a CUDA GPU; no adapter in this build"
    ),
)
