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
    # below triton for auto: a cold start JIT-compiles its kernels for over a minute, and its
    # decode steps were no faster than triton's on the H200 (docs/benchmarks/gpu-serving.md)
    priority=30,
    notes=("written against flashinfer-python 0.5.3; kernels JIT-compile on first use "
           "(set CUDA_HOME, and FLASHINFER_CUDA_ARCH_LIST such as 9.0a)",
           "reads fp8 KV caches (--kv-cache-dtype fp8_e4m3/fp8_e5m2) with their per-layer "
           "scales, on its FA2 kernels"),
)
