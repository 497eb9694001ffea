"""``--quantization bitsandbytes``: pre-quantized 4-bit checkpoints (``weight`` bytes with
``weight.absmax``, ``weight.quant_map``, nested statistics and the ``quant_state`` JSON) and
LLM.int8 ones (``weight`` int8 with ``SCB``); ``llm_int8_skip_modules`` stay dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import (BnB4bitMethod, BnB8bitMethod, PerLayer, QuantMethod,
                              bnb_rewrite, claim, excluding, unsupported)


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("bitsandbytes", quant_config, ("bitsandbytes",))
    skip = cfg.get("llm_int8_skip_modules") or []
    if cfg.get("load_in_8bit"):
        if cfg.get("llm_int8_has_fp16_weight"):
            raise unsupported("llm_int8_has_fp16_weight", True, "LLM.int8 checkpoints with "
                              "int8 weights (a float16-weight checkpoint is a dense one)")
        return PerLayer(excluding(skip, BnB8bitMethod(cfg.get("llm_int8_threshold", 6.0))))
    if not cfg.get("load_in_4bit", True):
        raise unsupported("load_in_4bit", False, "a 4-bit or an 8-bit (load_in_8bit) "
                          "bitsandbytes checkpoint")
    kind = str(cfg.get("bnb_4bit_quant_type", "nf4"))
    if kind not in ("nf4", "fp4"):
        raise unsupported("bnb_4bit_quant_type", kind, "nf4 or fp4")
    if str(cfg.get("bnb_4bit_quant_storage", "uint8")) != "uint8":
        raise unsupported("bnb_4bit_quant_storage", cfg.get("bnb_4bit_quant_storage"), "uint8")
    method = BnB4bitMethod(bool(cfg.get("bnb_4bit_use_double_quant", False)))
    return PerLayer(excluding(skip, method), rewrite=bnb_rewrite(kind))
