"""nvfp4_online (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin

plugin = Plugin(
    name='nvfp4_online',
    family="quantization",
    implementation=None,
    description='NVFP4 quantization of MoE expert weights at load',
    not_implemented="MoE-only (SM100 with FlashInfer TRT-LLM MoE): routed experts are served now but not quantized in this build, and a dense model's linears are left unchanged by this method",
)
