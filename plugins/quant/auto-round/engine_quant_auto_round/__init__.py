"""auto-round (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='auto-round',
    family="quantization",
    implementation="engine_quant_auto_round.impl",
    description='AutoRound checkpoints (packing auto_round:auto_gptq or auto_round:auto_awq, int 2/4/8-bit) through the GPTQ/AWQ layers',
    notes=(
        "the layers are gptq's or awq's exact dequantize paths",
    ),
)
