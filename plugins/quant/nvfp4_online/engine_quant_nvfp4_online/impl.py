"""``--quantization nvfp4_online``: a dense checkpoint's routed experts quantized to NVFP4 at
load, with NVFP4 activations per token; dense layers unchanged (emulated: see the manifest)."""

from typing import Any

import torch

from engine.api import hookimpl
from engine.api.quant import (EXPERTS, OnlineExperts, PerLayer, QuantMethod, claim,
                              fake_quant_nvfp4_rows, formats)


def _weights(w: torch.Tensor) -> torch.Tensor:
    return formats.fake_quant_nvfp4(w, per_row=False)


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    claim("nvfp4_online", quant_config, (), online=True)  # a quantized checkpoint: a conflict
    experts = OnlineExperts(_weights, fake_quant_nvfp4_rows)
    return PerLayer(lambda name: experts if EXPERTS.search(name) else None)
