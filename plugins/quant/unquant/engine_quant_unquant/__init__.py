"""unquant quantization: manifest only."""

from engine.api import Plugin

plugin = Plugin(
    name="unquant",
    family="quantization",
    implementation="engine_quant_unquant.impl",
    description="dense weights in the model dtype; a GGUF checkpoint is dequantized at load",
)
