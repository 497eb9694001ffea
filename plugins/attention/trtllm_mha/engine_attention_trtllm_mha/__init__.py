"""trtllm_mha attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="trtllm_mha",
    family="attention",
    implementation=None,
    description="TensorRT-LLM-gen MHA/GQA kernels through FlashInfer",
    requires=Requires(packages=("flashinfer-python",),
                      devices=("cuda",),
                      min_compute_capability=(10, 0),
                      max_compute_capability=(10, 3)),
    not_implemented=(
        "needs FlashInfer's TensorRT-LLM-gen MHA kernels: SM100 for prefill (decode also "
        "SM90/SM120), page size 16-128, not for MLA models; no adapter in this build"
    ),
)
