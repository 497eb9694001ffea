"""``--quantization quark_int4fp8_moe``: a dense checkpoint's routed experts quantized online to
int4 and multiplied with fp8 activations; its other linear layers online fp8 (emulated: see the
manifest)."""

from typing import Any

import torch

from engine.api import hookimpl
from engine.api.quant import (EXPERTS, Fp8Method, OnlineExperts, PerLayer, QuantMethod, claim,
                              fake_quant_fp8_rows, formats)


def _fp8_rows(x: torch.Tensor) -> torch.Tensor:
    return fake_quant_fp8_rows(x, torch.float8_e4m3fn)


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    claim("quark_int4fp8_moe", quant_config, (), online=True)  # a quantized checkpoint: a conflict
    experts = OnlineExperts(formats.int4_channel_values, _fp8_rows)
    linears = Fp8Method(online=True)
    return PerLayer(lambda name: experts if EXPERTS.search(name) else linears)
