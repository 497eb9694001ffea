"""modelopt (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='modelopt',
    family="quantization",
    implementation="engine_quant_modelopt.impl",
    description='NVIDIA ModelOpt checkpoints, dispatched by quant_algo: FP8 (static per-tensor), MXFP8 (emulated), NVFP4 / W4A16_NVFP4 (weights only)',
    notes=(
        'FP8: static per-tensor activations (largest input_scale of a fused layer); NVFP4: emulated weight-only, as Hopper GPUs serve it',
        'MXFP8: emulated, as --quantization mxfp8; MIXED_PRECISION is refused here: see modelopt_mixed',
    ),
)
