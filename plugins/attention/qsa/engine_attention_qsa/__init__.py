"""qsa attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="qsa",
    family="attention",
    implementation=None,
    description="QSA sparse attention (indexer-selected keys)",
    requires=Requires(devices=("cuda",),
                      min_compute_capability=(9, 0),
                      model_features=("qsa_sparse_attention",)),
    not_implemented=(
        "needs a model with QSA sparse-attention layers and their indexer cache, with CUDA "
        "sparse-attention kernels; no such model or adapter in this build"
    ),
)
