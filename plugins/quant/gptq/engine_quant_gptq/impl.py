"""``--quantization gptq``: GPTQ checkpoints (``quantization_config`` or ``quantize_config.json``);
GPTQModel ``-:`` dynamic rules keep modules dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, excluding, gptq_exclusions, gptq_method, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("gptq", quant_config, ("gptq",))
    if cfg.get("lm_head"):
        raise unsupported("lm_head", True, "a quantized output head is not served")
    return PerLayer(excluding(gptq_exclusions(cfg), gptq_method(cfg)))
