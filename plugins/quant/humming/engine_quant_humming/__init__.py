"""humming (quantization): manifest only (humming-kernels is imported on selection)."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="humming",
    family="quantization",
    implementation="engine_quant_humming.impl",
    description="gptq, awq and fp8 checkpoints multiplied by humming-kernels' JIT-compiled "
                "mixed-precision GEMMs (a backend switch over those formats)",
    requires=Requires(packages=("humming-kernels",), devices=("cuda",)),
    notes=("reads gptq (2/4/8 bits, no act-order), awq (4 bits) and fp8 (e4m3, dynamic "
           "activations) checkpoints as those choices do; half-precision models (--dtype "
           "bfloat16/float16); kernels JIT-compile on first use of a shape (nvcc or NVRTC)",
           "routed experts are not served through it (use gptq, awq or moe_wna16)"),
)
