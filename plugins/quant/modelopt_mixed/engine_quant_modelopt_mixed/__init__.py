"""modelopt_mixed (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='modelopt_mixed',
    family="quantization",
    implementation="engine_quant_modelopt_mixed.impl",
    description='ModelOpt MIXED_PRECISION checkpoints: per-layer FP8 or NVFP4 (weight-only) from quantized_layers',
    notes=(
        'emulated: NVFP4 layers weight-only (W4A16); FP8 layers as modelopt_fp8; MXFP8 layers emulated as mxfp8',
    ),
)
