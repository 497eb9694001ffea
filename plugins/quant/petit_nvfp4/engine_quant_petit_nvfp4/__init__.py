"""petit_nvfp4 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='petit_nvfp4',
    family="quantization",
    implementation="engine_quant_petit_nvfp4.impl",
    description='ModelOpt NVFP4 checkpoints served weight-only (W4A16), as the Petit ROCm kernels do',
    notes=(
        'emulated: the Petit kernels are ROCm-only (MI200/MI300); this build dequantizes NVFP4 weights at load (W4A16)',
    ),
)
