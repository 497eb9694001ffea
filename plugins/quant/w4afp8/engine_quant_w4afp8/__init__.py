"""w4afp8 (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin

plugin = Plugin(
    name='w4afp8',
    family="quantization",
    implementation=None,
    description='int4 MoE experts with fp8 activations; block-fp8 linears',
    not_implemented='MoE-only (CUTLASS W4A8 grouped GEMM, SM90): routed experts are served now but not quantized in this build',
)
