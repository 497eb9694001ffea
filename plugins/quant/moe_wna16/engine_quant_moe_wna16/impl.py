"""``--quantization moe_wna16``: a GPTQ or AWQ checkpoint of a MoE model; the model dequantizes
each routed expert's tensors at load (the method is a weight-only one)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, awq_method, claim, config_value, excluding, gptq_exclusions, gptq_method


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("moe_wna16", quant_config, ("gptq", "awq"))
    if cfg["quant_method"] == "awq":
        return PerLayer(excluding(config_value(cfg, "modules_to_not_convert", default=[]),
                                  awq_method(cfg)))
    return PerLayer(excluding(gptq_exclusions(cfg), gptq_method(cfg)))
