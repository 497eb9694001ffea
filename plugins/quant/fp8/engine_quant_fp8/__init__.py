"""fp8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='fp8',
    family="quantization",
    implementation="engine_quant_fp8.impl",
    description='fp8 e4m3 weights per tensor or in blocks (weight_scale_inv), dynamic per-token/per-group or static activations; online per-channel quantization of a dense checkpoint',
    notes=(
        'CPU: emulated arithmetic, exact: activations quantized to fp8 and back, then a dense product with the dequantized weight',
        'CUDA: torch._scaled_mm with row-wise scales for per-tensor/per-channel weights; block checkpoints dequantize',
        'block checkpoints whose block does not divide the fused q/k/v partitions are served exactly (scales kept per shard)',
    ),
)
