"""mxfp_w4a8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='mxfp_w4a8',
    family="quantization",
    implementation="engine_quant_mxfp_w4a8.impl",
    description='MXFP4 weights with MXFP8 activations',
    notes=(
        "emulated: the native kernels are Ascend A5's (torch_npu); here a dense checkpoint's "
        "weights are quantized to MXFP4 at load and dequantized, and each activation is "
        "quantized to MXFP8 and back (per token and 32 columns) before a dense product",
        "online only: ModelSlim W4A8_MXFP checkpoints (quant_model_description.json) are not "
        "read in this build",
    ),
)
