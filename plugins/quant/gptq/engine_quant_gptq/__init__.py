"""gptq (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='gptq',
    family="quantization",
    implementation="engine_quant_gptq.impl",
    description='GPTQ int32-packed 2/4/8-bit weights, per-group or per-channel, act-order (g_idx), v1/v2 zeros; dequantize-then-matmul',
    notes=(
        'CPU and CUDA: weights dequantized once at load into the model dtype (exact against the float reference; the matmul is the dense one)',
    ),
)
