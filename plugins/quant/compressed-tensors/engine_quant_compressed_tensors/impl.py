"""``--quantization compressed-tensors``: the checkpoint's ``config_groups`` decide each layer's scheme;
``ignore`` layers stay dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, compressed_tensors_scheme


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("compressed-tensors", quant_config, ("compressed-tensors",))
    return PerLayer(compressed_tensors_scheme(cfg))
