"""``--quantization modelopt``: ``quant_algo`` FP8, MXFP8 or NVFP4 (config.json or hf_quant_config.json)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, modelopt_scheme


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("modelopt", quant_config, ("modelopt",))
    return PerLayer(modelopt_scheme(cfg, ("FP8", "MXFP8", "NVFP4", "W4A16_NVFP4")))
