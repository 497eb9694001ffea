"""``--quantization mxfp_w4a8``: online MXFP4 weights with dynamic MXFP8 activations
(emulated: see the manifest)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import MXFP4Method, PerLayer, QuantMethod, claim


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    claim("mxfp_w4a8", quant_config, (), online=True)  # a quantized checkpoint: a conflict
    return PerLayer(lambda name: MXFP4Method(online=True, act="mxfp8"))
