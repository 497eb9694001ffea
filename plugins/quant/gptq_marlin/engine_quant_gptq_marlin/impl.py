"""``--quantization gptq_marlin``: the Marlin choice's rules (symmetric, 4 or 8 bits) over gptq's
layers. This build has no Marlin kernel: every layer runs gptq's dequantize path, and a layer
whose shape Marlin could not take (K % 128, N % 64) is logged as such."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, excluding, gptq_exclusions, gptq_method, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    import logging

    cfg = claim("gptq_marlin", quant_config, ("gptq",))
    method = gptq_method(cfg)
    if method.bits not in (4, 8) or not cfg.get("sym", True):
        raise unsupported("sym" if method.bits in (4, 8) else "bits",
                          cfg.get("sym") if method.bits in (4, 8) else method.bits,
                          "Marlin serves symmetric 4/8-bit GPTQ; use --quantization gptq")
    log = logging.getLogger("engine.quant")
    log.info("gptq_marlin: no Marlin kernel in this build; gptq's exact dequantize path serves "
             "every layer")
    return PerLayer(excluding(gptq_exclusions(cfg), method))
