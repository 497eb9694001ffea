"""``--quantization modelopt_mixed``: ``quant_algo: MIXED_PRECISION`` with ``quantized_layers``
(layer -> FP8 / MXFP8 / NVFP4 / W4A16_NVFP4); layers not listed stay dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, checkpoint_names, claim, modelopt_scheme, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("modelopt_mixed", quant_config, ("modelopt",))
    if str(cfg.get("quant_algo", "")).upper() != "MIXED_PRECISION":
        raise unsupported("quant_algo", cfg.get("quant_algo"), "modelopt_mixed reads MIXED_PRECISION")
    layers = cfg.get("quantized_layers") or {}
    schemes = {}

    def scheme(name: str) -> Any:
        algos = {str((layers.get(p) or {}).get("quant_algo", "")).upper()
                 for p in checkpoint_names(name)}
        if algos == {""}:
            return None
        if len(algos) != 1:
            raise unsupported(f"quantized_layers[{name}]", sorted(algos),
                              "a fused layer must use one quant_algo")
        algo = algos.pop()
        if algo not in schemes:
            schemes[algo] = modelopt_scheme({"quant_algo": algo},
                                            ("FP8", "MXFP8", "NVFP4", "W4A16_NVFP4"))
        return schemes[algo](name)
    return PerLayer(scheme)
