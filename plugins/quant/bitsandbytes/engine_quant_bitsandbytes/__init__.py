"""bitsandbytes (quantization): manifest only; this build has no implementation."""

from engine.api import Plugin

plugin = Plugin(
    name='bitsandbytes',
    family="quantization",
    implementation=None,
    description='bitsandbytes NF4/FP4 4-bit and LLM.int8 weights',
    not_implemented="no adapter in this build for the bitsandbytes library's pre-quantized state (quant_state tensors) or its online quantization",
)
