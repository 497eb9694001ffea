"""w8a8_int8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='w8a8_int8',
    family="quantization",
    implementation="engine_quant_w8a8_int8.impl",
    description='int8 W8A8: per-channel int8 weights, dynamic per-token (or static) int8 activations, exact integer products',
    notes=(
        'CPU and CUDA: torch._int_mm (exact int32 sums; CUDA pads decode batches to 17 rows), batch-invariant',
    ),
)
