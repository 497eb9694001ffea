"""w8a8_fp8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='w8a8_fp8',
    family="quantization",
    implementation="engine_quant_w8a8_fp8.impl",
    description='fp8 W8A8: compressed-tensors fp8 checkpoints or online per-channel weights, dynamic per-token activations',
    notes=(
        'CPU: emulated arithmetic, exact (fp8 activations quantized and dequantized; dense product)',
        'CUDA: torch._scaled_mm, row-wise scales',
    ),
)
