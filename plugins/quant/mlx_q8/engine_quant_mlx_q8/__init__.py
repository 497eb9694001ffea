"""mlx_q8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='mlx_q8',
    family="quantization",
    implementation="engine_quant_mlx_q8.impl",
    description='mlx-community 8-bit affine checkpoints (uint32 codes, scales and biases per group of 64); dequantize-then-matmul',
    notes=(
        'a quantized embedding (and output head) is dequantized at load',
    ),
)
