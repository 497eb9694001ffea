"""``--quantization quark_mxfp4``: online MXFP4 W4A4 of a dense checkpoint (emulated), or a
Quark MXFP4 checkpoint as ``quark`` reads it."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import MXFP4_DTYPES, MXFP4Method, PerLayer, QuantMethod, claim, \
    quark_scheme, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("quark_mxfp4", quant_config, ("quark",), online=True)
    if cfg is None:
        return PerLayer(lambda name: MXFP4Method(online=True))
    dtype = ((cfg.get("global_quant_config") or {}).get("weight") or {}).get("dtype")
    if str(dtype).lower() not in MXFP4_DTYPES:
        raise unsupported("global_quant_config.weight.dtype", dtype,
                          "quark_mxfp4 quantizes dense checkpoints and reads MXFP4 ones; serve "
                          "this one with --quantization quark")
    return PerLayer(quark_scheme(cfg))
