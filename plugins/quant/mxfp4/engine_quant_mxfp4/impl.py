"""``--quantization mxfp4``: a dense MoE checkpoint's routed experts quantized to MXFP4 at load,
activations unquantized, dense layers unchanged (emulated: see the manifest)."""

from typing import Any

import torch

from engine.api import ConfigError, hookimpl
from engine.api.quant import EXPERTS, OnlineExperts, PerLayer, QuantMethod, claim, formats


def _weights(w: torch.Tensor) -> torch.Tensor:
    return formats.dequant_mxfp4(*formats.quantize_mxfp4(w))


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    if quant_config and str(quant_config.get("quant_method", "")).lower() == "mxfp4":
        raise ConfigError("--quantization mxfp4: this checkpoint is gpt-oss's MXFP4 layout, "
                          "read with the gpt-oss architecture, which this build does not serve; "
                          "mxfp4 quantizes a dense MoE checkpoint's experts at load")
    claim("mxfp4", quant_config, (), online=True)  # another quantized checkpoint: a conflict
    experts = OnlineExperts(_weights, None)
    return PerLayer(lambda name: experts if EXPERTS.search(name) else None)
