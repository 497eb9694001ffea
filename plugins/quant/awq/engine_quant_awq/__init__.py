"""awq (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='awq',
    family="quantization",
    implementation="engine_quant_awq.impl",
    description='AWQ 4-bit GEMM-layout weights with zero points, per group; dequantize-then-matmul',
    notes=(
        'CPU and CUDA: weights dequantized once at load (exact against the float reference)',
    ),
)
