"""``--quantization fp8``: ``quant_method: fp8`` checkpoints, or online quantization of a dense one
(per-channel weights, dynamic per-token activations)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, config_value, excluding, fp8_method


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("fp8", quant_config, ("fp8",), online=True)
    ignored = [] if cfg is None else config_value(cfg, "ignored_layers", "modules_to_not_convert",
                                                  default=[])
    return PerLayer(excluding(ignored, fp8_method(cfg)))
