"""``--quantization unquant``: every linear layer dense (``F.linear``), whatever the checkpoint
says; packed GGUF blocks reach it dequantized by the loader. A checkpoint quantized in another
format is refused with its method (its tensors are not dense weights)."""

from typing import Any

from engine.api import ConfigError, hookimpl
from engine.api.quant import QuantMethod, UnquantizedMethod


@hookimpl
def engine_create_quant_method(model_config: Any, config: Any, quant_config: Any,
                               device: Any) -> QuantMethod:
    method = str((quant_config or {}).get("quant_method", "gguf"))
    if method != "gguf":
        raise ConfigError(f"--quantization unquant conflicts with the checkpoint, which is "
                          f"quantized with {method!r}; unquant serves dense and GGUF "
                          f"checkpoints (serve this one with --quantization {method})")
    return UnquantizedMethod()
