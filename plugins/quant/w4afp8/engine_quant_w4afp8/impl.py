"""``--quantization w4afp8``: int4 routed experts with static fp8 activations, block-fp8 linear
layers (emulated: see the manifest).

Expert projection tensors: ``weight`` int8 [N, K/2], ``weight_scale_inv`` float32
[N, K/group], ``input_scale``; linear layers: ``weight`` fp8 e4m3 with ``weight_scale_inv`` per
block. ``group_size`` (128) and ``weight_block_size`` ([128, 128]) are read when the config
gives them."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import (EXPERTS, Fp8Method, PerLayer, QuantMethod, W4AFp8ExpertMethod,
                              claim, unsupported)


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("w4afp8", quant_config, ("w4afp8",))
    block = tuple(int(v) for v in cfg.get("weight_block_size") or (128, 128))
    if len(block) != 2:
        raise unsupported("weight_block_size", cfg.get("weight_block_size"),
                          "two sizes (output rows, input columns) are read")
    experts = W4AFp8ExpertMethod(int(cfg.get("group_size") or 128))
    linears = Fp8Method(weight_scheme="block", block=block, act="dynamic", act_group=block[1],
                        scale_name="weight_scale_inv")
    return PerLayer(lambda name: experts if EXPERTS.search(name) else linears)
