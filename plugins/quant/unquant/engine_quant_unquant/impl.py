"""``--quantization unquant``: every linear layer dense (``F.linear``), whatever the checkpoint
says; packed GGUF blocks reach it dequantized by the loader."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import QuantMethod, UnquantizedMethod


@hookimpl
def engine_create_quant_method(model_config: Any, config: Any, quant_config: Any,
                               device: Any) -> QuantMethod:
    return UnquantizedMethod()
