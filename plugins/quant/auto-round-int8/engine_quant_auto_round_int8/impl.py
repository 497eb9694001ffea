"""``--quantization auto-round-int8``: an AutoRound INT8 export (compressed-tensors int8 W8A8).
A dense checkpoint would be quantized by the auto-round library at start-up: refused here."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, compressed_tensors_scheme


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    from engine.api import ConfigError

    if not quant_config:
        raise ConfigError("--quantization auto-round-int8: the checkpoint is dense; quantizing it at "
                          "start-up needs the auto-round library (not a dependency of this build); "
                          "export it with auto-round (scheme INT8, format llm_compressor) first")
    cfg = claim("auto-round-int8", quant_config, ("compressed-tensors",))
    return PerLayer(compressed_tensors_scheme(cfg))
