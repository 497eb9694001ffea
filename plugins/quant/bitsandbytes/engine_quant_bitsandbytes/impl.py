"""``--quantization bitsandbytes``: pre-quantized 4-bit checkpoints (``weight`` bytes with
``weight.absmax``, ``weight.quant_map``, nested statistics and the ``quant_state`` JSON);
``llm_int8_skip_modules`` stay dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import (BnB4bitMethod, PerLayer, QuantMethod, bnb_rewrite, claim,
                              excluding, unsupported)


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("bitsandbytes", quant_config, ("bitsandbytes",))
    if cfg.get("load_in_8bit") or not cfg.get("load_in_4bit", True):
        raise unsupported("load_in_8bit", True, "4-bit bitsandbytes checkpoints are served "
                          "(LLM.int8's outlier decomposition is not reproduced)")
    kind = str(cfg.get("bnb_4bit_quant_type", "nf4"))
    if kind not in ("nf4", "fp4"):
        raise unsupported("bnb_4bit_quant_type", kind, "nf4 or fp4")
    if str(cfg.get("bnb_4bit_quant_storage", "uint8")) != "uint8":
        raise unsupported("bnb_4bit_quant_storage", cfg.get("bnb_4bit_quant_storage"), "uint8")
    method = BnB4bitMethod(bool(cfg.get("bnb_4bit_use_double_quant", False)))
    return PerLayer(excluding(cfg.get("llm_int8_skip_modules") or [], method),
                    rewrite=bnb_rewrite(kind))
