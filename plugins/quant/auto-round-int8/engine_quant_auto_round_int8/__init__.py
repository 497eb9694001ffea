"""auto-round-int8 (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='auto-round-int8',
    family="quantization",
    implementation="engine_quant_auto_round_int8.impl",
    description='int8 W8A8 checkpoints exported by AutoRound (llm_compressor format) through the w8a8_int8 layers',
    notes=(
        "served: AutoRound's INT8 exports (exact int32 products); online AutoRound quantization of a dense checkpoint is refused (needs the auto-round library)",
    ),
)
