"""quark (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='quark',
    family="quantization",
    implementation="engine_quant_quark.impl",
    description='AMD Quark fp8 checkpoints: per-tensor or per-channel fp8 weights, static or dynamic fp8 activations',
    notes=(
        'fp8 only: Quark MXFP4 / W4A8 schemes are refused with the field (they need gfx950)',
        'CPU: emulated arithmetic, exact; CUDA: torch._scaled_mm',
    ),
)
