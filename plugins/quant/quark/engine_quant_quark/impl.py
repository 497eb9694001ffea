"""``--quantization quark``: Quark ``global_quant_config`` fp8 and MXFP4 schemes; ``exclude`` layers
dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import PerLayer, QuantMethod, claim, quark_scheme


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("quark", quant_config, ("quark",))
    return PerLayer(quark_scheme(cfg))
