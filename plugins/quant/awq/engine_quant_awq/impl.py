"""``--quantization awq``: AWQ checkpoints (``quantization_config``, ``quant_config.json`` or
``quantize_config.json``); ``modules_to_not_convert`` stay dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, awq_method, claim, config_value, excluding


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("awq", quant_config, ("awq",))
    return PerLayer(excluding(config_value(cfg, "modules_to_not_convert", default=[]),
                              awq_method(cfg)))
