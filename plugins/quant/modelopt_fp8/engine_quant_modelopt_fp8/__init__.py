"""modelopt_fp8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='modelopt_fp8',
    family="quantization",
    implementation="engine_quant_modelopt_fp8.impl",
    description='ModelOpt FP8: per-tensor fp8 weights, static per-tensor fp8 activations',
    notes=(
        'CPU: emulated arithmetic, exact; CUDA: torch._scaled_mm',
        'q/k/v (and gate/up) share the largest input_scale of their shards',
    ),
)
