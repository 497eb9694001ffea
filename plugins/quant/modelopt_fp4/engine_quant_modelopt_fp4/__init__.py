"""modelopt_fp4 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='modelopt_fp4',
    family="quantization",
    implementation="engine_quant_modelopt_fp4.impl",
    description='ModelOpt NVFP4 checkpoints served weight-only (W4A16), as SGLang serves them on SM80-SM90',
    notes=(
        "emulated: no FP4 tensor cores here; weights are dequantized (W4A16), activations are not quantized (SM100's W4A4 is not reproduced)",
    ),
)
