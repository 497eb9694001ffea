"""``--quantization petit_nvfp4``: the NVFP4 W4A16 computation of the Petit kernels, done by
dequantizing at load."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, modelopt_scheme


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("petit_nvfp4", quant_config, ("modelopt",))
    return PerLayer(modelopt_scheme(cfg, ("NVFP4", "W4A16_NVFP4")))
