"""modelslim (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='modelslim',
    family="quantization",
    implementation="engine_quant_modelslim.impl",
    description='Ascend msModelSlim checkpoints (quant_model_description.json)',
    notes=(
        "emulated: the native kernels are Ascend NPUs' (torch_npu, CANN); here W8A8 (static, "
        "asymmetric per-tensor activations: (x_q @ W^T + quant_bias) * deq_scale), "
        "W8A8_DYNAMIC and W4A4_DYNAMIC (symmetric per-token activations) are computed with "
        "exact integer products",
        "routed experts quantized by msModelSlim, and its MX types, are not read in this build",
    ),
)
