"""moe_wna16 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='moe_wna16',
    family="quantization",
    implementation="engine_quant_moe_wna16.impl",
    description='GPTQ/AWQ checkpoints of MoE models: the dense linears as gptq/awq; routed experts refused',
    notes=(
        'MoE-only method: routed experts are served now but not quantized, so a checkpoint with quantized experts is refused; dense linears run as gptq/awq',
    ),
)
