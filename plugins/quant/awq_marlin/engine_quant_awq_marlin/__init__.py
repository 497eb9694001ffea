"""awq_marlin (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='awq_marlin',
    family="quantization",
    implementation="engine_quant_awq_marlin.impl",
    description="AWQ checkpoints as SGLang's Marlin choice reads them; served by awq's exact dequantize path",
    notes=(
        "emulated: no Marlin kernel in this build; every layer takes SGLang's per-layer fallback, plain AWQ (exact dequantize path)",
    ),
)
