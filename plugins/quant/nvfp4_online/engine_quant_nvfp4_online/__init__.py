"""nvfp4_online (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='nvfp4_online',
    family="quantization",
    implementation="engine_quant_nvfp4_online.impl",
    description='NVFP4 quantization of MoE expert weights at load',
    notes=(
        "emulated: the native path is SM100's FlashInfer TRT-LLM MoE; here a dense "
        "checkpoint's routed experts are quantized at load to NVFP4 (a global scale per "
        "projection, e4m3 scales per 16, E2M1 elements) and each row they multiply is "
        "quantized to NVFP4 and back with a per-token global scale, before a dense product",
        "a model without routed experts is unchanged (dense linears stay unquantized)",
    ),
)
