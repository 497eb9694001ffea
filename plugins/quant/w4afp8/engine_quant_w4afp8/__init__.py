"""w4afp8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='w4afp8',
    family="quantization",
    implementation="engine_quant_w4afp8.impl",
    description='int4 MoE experts with fp8 activations; block-fp8 linears',
    notes=(
        "emulated: the native kernel is CUTLASS's W4A8 grouped GEMM (SM90); here each routed "
        "expert's int4 weights (two per byte, a float32 scale per 128 inputs) are dequantized "
        "at load and the rows they multiply are rounded to fp8 e4m3 with the layer's static "
        "input scale (the largest of its experts'), before a dense product; the other linear "
        "layers are block fp8 (128x128, dynamic activations per 128 columns)",
    ),
)
