"""mxfp4 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='mxfp4',
    family="quantization",
    implementation="engine_quant_mxfp4.impl",
    description='MXFP4 (gpt-oss) MoE experts',
    notes=(
        "emulated: the native kernels are triton_kernels / FlashInfer / Marlin; here a dense "
        "MoE checkpoint's routed experts are quantized at load to MXFP4 (E2M1 elements, a "
        "power-of-two scale per 32) and dequantized, with unquantized activations (W4A16, as "
        "on Hopper); dense linear layers stay unquantized",
        "gpt-oss checkpoints (experts' *_blocks / *_scales) need the gpt-oss architecture, "
        "which this build does not serve",
    ),
)
