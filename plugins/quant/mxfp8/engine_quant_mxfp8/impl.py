"""``--quantization mxfp8``: ``quant_method: mxfp8`` or ModelOpt ``quant_algo: MXFP8``
checkpoints, or online MXFP8 of a dense one (emulated: see the manifest)."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import MXFP8Method, PerLayer, QuantMethod, claim, config_value, \
    excluding, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("mxfp8", quant_config, ("mxfp8", "modelopt"), online=True)
    if cfg is None:
        return PerLayer(lambda name: MXFP8Method(online=True))
    if cfg["quant_method"] == "modelopt" and str(cfg.get("quant_algo", "")).upper() != "MXFP8":
        raise unsupported("quant_algo", cfg.get("quant_algo"), "mxfp8 reads MXFP8")
    ignored = config_value(cfg, "ignored_layers", "modules_to_not_convert", "exclude_modules",
                           "ignore", default=[])
    return PerLayer(excluding(ignored, MXFP8Method()))
