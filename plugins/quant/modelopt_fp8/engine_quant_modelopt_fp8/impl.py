"""``--quantization modelopt_fp8``: ModelOpt ``quant_algo: FP8`` checkpoints."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, modelopt_scheme


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("modelopt_fp8", quant_config, ("modelopt",))
    return PerLayer(modelopt_scheme(cfg, ("FP8",)))
