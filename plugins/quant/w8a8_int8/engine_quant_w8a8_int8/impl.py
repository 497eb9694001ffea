"""``--quantization w8a8_int8``: compressed-tensors int8 W8A8 checkpoints; products in int32
(``torch._int_mm``), scaled per token and channel."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, compressed_tensors_scheme, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("w8a8_int8", quant_config, ("compressed-tensors", "w8a8_int8"))
    for group in cfg.get("config_groups", {}).values():
        if group.get("input_activations") is None or group["weights"].get("type") != "int":
            raise unsupported("config_groups", group.get("weights"),
                              "w8a8_int8 reads int8 W8A8 compressed-tensors checkpoints")
    return PerLayer(compressed_tensors_scheme(cfg))
