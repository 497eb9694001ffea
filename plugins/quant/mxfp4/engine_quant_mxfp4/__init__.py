"""mxfp4 (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin

plugin = Plugin(
    name='mxfp4',
    family="quantization",
    implementation=None,
    description='MXFP4 (gpt-oss) MoE experts',
    not_implemented='MoE-only (gpt-oss experts, triton_kernels/FlashInfer/Marlin): routed experts are served now but not quantized in this build; its dense linears are unquantized',
)
