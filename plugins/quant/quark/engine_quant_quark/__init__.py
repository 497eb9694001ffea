"""quark (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='quark',
    family="quantization",
    implementation="engine_quant_quark.impl",
    description='AMD Quark checkpoints: fp8 (per-tensor or per-channel weights, static or dynamic fp8 activations) and MXFP4 (W4A4 or W4A16, emulated)',
    notes=(
        'MXFP4 (W4A4, W4A16): emulated, dequantized weights and MXFP4 fake-quantized activations (the native kernels need gfx950); W4A8 MXFP4-FP8 is MoE-only and refused with the field',
        'CPU: emulated arithmetic, exact; CUDA: torch._scaled_mm',
    ),
)
