"""flashinfer attention: manifest only (flashinfer is imported on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="flashinfer",
    family="attention",
    implementation="engine_attention_flashinfer.impl",
    description="FlashInfer BatchPrefill/BatchDecode paged-KV wrappers (NHD, tensor-core "
                "decode), planned once per batch and reused by every layer",
    requires=Requires(packages=("flashinfer-python",), devices=("cuda",),
                      min_compute_capability=(8, 0)),
    # below triton for auto: no CUDA-graph decode path yet (H200, Llama-3-8B shape, batch 1:
    # ~22 ms/step eager vs 5.25 for triton + graphs; docs/benchmarks/attention-h200.md)
    priority=30,
    notes=("written against flashinfer-python 0.5.3; kernels JIT-compile on first use "
           "(set CUDA_HOME, and FLASHINFER_CUDA_ARCH_LIST such as 9.0a)",),
)
