"""mxfp8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='mxfp8',
    family="quantization",
    implementation="engine_quant_mxfp8.impl",
    description='MXFP8: e4m3 weights with UE8M0 scales per 32, dynamic MXFP8 activations',
    notes=(
        "emulated: MX tensor cores start at SM100; the weights are dequantized at load and each "
        "activation is quantized to MXFP8 and back before a dense product (exact against the "
        "format's dequantize-then-float reference)",
        "reads quant_method mxfp8 and ModelOpt quant_algo MXFP8 checkpoints, or quantizes a "
        "dense checkpoint at load",
    ),
)
