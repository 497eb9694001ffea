"""quark_mxfp4 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='quark_mxfp4',
    family="quantization",
    implementation="engine_quant_quark_mxfp4.impl",
    description='online MXFP4 W4A4 requantization',
    notes=(
        "emulated: MXFP4 kernels exist for AMD gfx950 only (aiter); here a dense checkpoint's "
        "weights are quantized to MXFP4 at load and dequantized, and each activation is "
        "quantized to MXFP4 and back before a dense product (OCP scales)",
        "a Quark MXFP4 checkpoint is read as --quantization quark reads it",
    ),
)
