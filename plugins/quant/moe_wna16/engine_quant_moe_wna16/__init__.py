"""moe_wna16 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='moe_wna16',
    family="quantization",
    implementation="engine_quant_moe_wna16.impl",
    description='GPTQ/AWQ checkpoints of MoE models: the dense linears as gptq/awq, the routed experts dequantized at load',
    notes=(
        "routed experts: each expert's GPTQ/AWQ tensors are dequantized at load into the "
        "stacked expert weights the MoE runner reads (exact against the format's dequantized "
        "values; no int4 expert kernel in this build)",
    ),
)
