"""``--quantization modelopt_fp4``: ModelOpt NVFP4 / W4A16_NVFP4 weights, dequantized at load
(activations stay in the model dtype: the W4A16 path Hopper-class GPUs use)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, modelopt_scheme


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("modelopt_fp4", quant_config, ("modelopt",))
    return PerLayer(modelopt_scheme(cfg, ("NVFP4", "W4A16_NVFP4")))
