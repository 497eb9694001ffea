"""trtllm_mla attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="trtllm_mla",
    family="attention",
    implementation=None,
    description="TensorRT-LLM-gen MLA kernels through FlashInfer",
    requires=Requires(packages=("flashinfer-python",),
                      devices=("cuda",),
                      min_compute_capability=(10, 0),
                      max_compute_capability=(10, 3),
                      model_features=("mla",)),
    not_implemented=(
        "needs FlashInfer's TensorRT-LLM-gen MLA kernels on a Blackwell GPU (SM100) and an "
        "MLA model, page size 32 or 64; no adapter in this build"
    ),
)
