"""gptq_marlin (quantization): manifest only (the implementation loads on selection)."""

from engine.api import Plugin

plugin = Plugin(
    name='gptq_marlin',
    family="quantization",
    implementation="engine_quant_gptq_marlin.impl",
    description="GPTQ symmetric 4/8-bit checkpoints as SGLang's Marlin choice reads them; served by gptq's exact dequantize path",
    notes=(
        "emulated: no Marlin kernel in this build; the layers run gptq's exact dequantize path",
        "SGLang's Marlin needs K % 128 == 0 and N % 64 == 0 (SmolLM2's K=576 fails it); the exact path has no shape rule",
    ),
)
