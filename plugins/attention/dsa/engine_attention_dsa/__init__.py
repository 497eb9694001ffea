"""dsa attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="dsa",
    family="attention",
    implementation=None,
    description="DeepSeek Sparse Attention (lightning indexer + sparse MLA)",
    requires=Requires(packages=("flash-mla", "deep-gemm"),
                      devices=("cuda",),
                      min_compute_capability=(9, 0),
                      max_compute_capability=(10, 3),
                      model_features=("mla", "deepseek_sparse_attention")),
    not_implemented=(
        "needs a DeepSeek-sparse-attention model (DeepSeek-V3.2, GLM-5) with its indexer, "
        "FlashMLA sparse and DeepGEMM kernels on SM90/SM100, page size 64; no adapter in this"
        " build"
    ),
)
