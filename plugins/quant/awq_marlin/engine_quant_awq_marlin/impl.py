"""``--quantization awq_marlin``: awq's layers (Marlin's per-layer fallback to plain AWQ is
every layer here: this build has no Marlin kernel)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, awq_method, claim, config_value, excluding


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("awq_marlin", quant_config, ("awq",))
    return PerLayer(excluding(config_value(cfg, "modules_to_not_convert", default=[]),
                              awq_method(cfg)))
