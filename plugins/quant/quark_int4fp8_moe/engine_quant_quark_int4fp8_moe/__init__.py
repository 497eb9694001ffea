"""quark_int4fp8_moe (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='quark_int4fp8_moe',
    family="quantization",
    implementation="engine_quant_quark_int4fp8_moe.impl",
    description='online int4 MoE experts upcast to fp8, fp8 linears',
    notes=(
        "emulated: the native kernels are AMD CDNA3/CDNA4's (ROCm, aiter); here a dense "
        "checkpoint's routed experts are quantized at load to int4 per output channel "
        "(symmetric, scale amax/7; the int4 values are exact in fp8) and each row they multiply "
        "is quantized to fp8 e4m3 and back per token, before a dense product; every other "
        "linear layer is fp8 quantized online (per channel, dynamic per-token activations)",
        "a model without routed experts gets the fp8 linears only",
    ),
)
