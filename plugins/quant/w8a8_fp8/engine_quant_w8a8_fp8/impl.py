"""``--quantization w8a8_fp8``: a compressed-tensors fp8 checkpoint, or online per-channel fp8 of a
dense one, with dynamic per-token activations."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import Fp8Method, PerLayer, QuantMethod, claim, compressed_tensors_scheme, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("w8a8_fp8", quant_config, ("compressed-tensors", "fp8"), online=True)
    if cfg is None:
        return PerLayer(lambda name: Fp8Method(weight_scheme="channel", online=True))
    if cfg["quant_method"] == "fp8":
        raise unsupported("quant_method", "fp8", "w8a8_fp8 reads compressed-tensors fp8; serve this "
                          "checkpoint with --quantization fp8")
    scheme = compressed_tensors_scheme(cfg)
    for group in cfg.get("config_groups", {}).values():
        if (group.get("weights") or {}).get("type") != "float":
            raise unsupported("config_groups.weights.type", group["weights"].get("type"),
                              "w8a8_fp8 reads fp8 compressed-tensors checkpoints")
    return PerLayer(scheme)
