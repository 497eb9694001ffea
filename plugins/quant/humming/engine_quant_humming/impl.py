"""``--quantization humming``: gptq, awq and fp8 checkpoints multiplied by humming-kernels.

The checkpoint is read exactly as ``--quantization gptq`` / ``awq`` / ``fp8`` read it (the same
config readers, exclusions and tensors); once a layer is loaded its tensors go to one
``humming.layer.HummingLayer`` (fused shards side by side along the output features), which
repacks them for its kernels, and the layer's product is that layer's forward.

- gptq / awq: the library's gptq and awq weight schemas. GPTQ v1 checkpoints store each zero
  point minus one: the zeros are repacked with the offset applied before humming reads them
  (symmetric checkpoints use the fixed midpoint and no zeros).
- fp8 (e4m3 weights): humming's own schema, 128 x 128-style blocks as float32 block scales
  (each fused shard a whole number of blocks), per-tensor and per-channel scales as channel
  scales; dynamic activations quantized by humming per 1 x ``block_k`` group (block formats)
  or per token, as the format says; static activation scales are refused.

Act-order GPTQ (``desc_act``), float32 models and routed experts are refused with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.api import ConfigError, hookimpl
from engine.api.quant import (AWQMethod, Fp8Method, GPTQMethod, Linear, PerLayer, QuantMethod,
                              awq_method, claim, config_value, drop_checkpoint_params, excluding,
                              formats, fp8_method, gptq_exclusions, gptq_method, unsupported)

HALF = (torch.float16, torch.bfloat16)
#: output features are padded to whole 128-wide tiles (humming's SM90 tiles of half-precision
#: inputs are four 32-wide warps); the product returns only the layer's own features
PAD_N = 128


def _humming_layer(method: Any, layer: Linear, weight_config: dict[str, Any],
                   tensors: dict[str, torch.Tensor],
                   input_config: dict[str, Any] | None = None) -> Any:
    """One ``HummingLayer`` over ``tensors`` (named as ``weight_config``'s schema names them;
    copied into its parameters, converted to their dtypes), transformed for its kernels."""
    dtype = layer.quant_dtype
    if dtype not in HALF:
        raise ConfigError(f"{method.prefix}: --quantization humming computes in float16 or "
                          f"bfloat16, the model is {dtype} (pass --dtype bfloat16)")
    device = next(iter(tensors.values())).device
    if device.type != "cuda":
        raise ConfigError(f"{method.prefix}: --quantization humming needs a CUDA GPU")
    from humming.layer import HummingLayer

    with torch.cuda.device(device):
        hl = HummingLayer(shape_n=layer.out_features, shape_k=layer.in_features,
                          weight_config=weight_config, input_config=input_config,
                          torch_dtype=dtype, pad_n_to_multiple=PAD_N).to(device)
        hl.load_from_tensors(tensors)
        hl.transform()
    return hl


class Humming:
    """The product of a layer is its ``HummingLayer``'s, built once the format's own method
    has loaded the checkpoint's tensors (:meth:`humming_inputs`); put first in the bases so
    that it replaces the format's repacking and product."""

    serves_experts = False

    def humming_inputs(self, layer: Linear) -> tuple[dict, dict, dict | None]:
        """(humming's weight config, the tensors it reads by their schema names, its input
        config or None for unquantized activations)."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: Linear) -> None:
        weight, tensors, act = self.humming_inputs(layer)
        layer.humming = _humming_layer(self, layer, weight, tensors, act)
        drop_checkpoint_params(layer)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if rows.dtype != layer.quant_dtype:
            rows = rows.to(layer.quant_dtype)
        out = layer.humming(rows.contiguous())
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


class HummingGPTQ(Humming, GPTQMethod):
    """gptq's tensors (the library's gptq schema; v1 zeros repacked with their offset)."""

    def humming_inputs(self, layer: Linear) -> tuple[dict, dict, dict | None]:
        tensors = {"qweight": layer.qweight.data, "scales": layer.scales.data}
        sym = self.sym
        if not sym:
            zeros = formats.unpack_int32(layer.qzeros.data, self.bits, 1) + self.zero_offset
            if int(zeros.max()) >= 1 << self.bits:
                raise ConfigError(f"{self.prefix}: a GPTQ v1 zero point of {1 << self.bits} "
                                  f"does not fit {self.bits} bits; use --quantization gptq")
            tensors["qzeros"] = formats.pack_int32(zeros.to(torch.int32), self.bits, 1)
        return ({"quant_method": "gptq", "bits": self.bits, "group_size": layer.group,
                 "desc_act": False, "sym": sym}, tensors, None)


class HummingAWQ(Humming, AWQMethod):
    """awq's tensors (the library's awq schema)."""

    def humming_inputs(self, layer: Linear) -> tuple[dict, dict, dict | None]:
        return ({"quant_method": "awq", "bits": 4, "group_size": layer.group,
                 "zero_point": True},
                {"qweight": layer.qweight.data, "qzeros": layer.qzeros.data,
                 "scales": layer.scales.data}, None)


class HummingFp8(Humming, Fp8Method):
    """fp8's tensors (e4m3) in humming's own schema: block scales as float32 blocks, per-tensor
    and per-channel scales as channel scales; dynamic activations as the format quantizes
    them."""

    def humming_inputs(self, layer: Linear) -> tuple[dict, dict, dict | None]:
        n, k = layer.out_features, layer.in_features
        fp8 = {"quant_method": "humming", "b_dtype": "float8e4m3"}
        if self.weight_scheme == "block":
            bn, bk = self.block
            shards = getattr(layer, "shards", None) or (n,)
            if any(s % bn for s in shards) or k % bk:
                raise ConfigError(f"{self.prefix}: humming takes fp8 blocks of {bn} x {bk} "
                                  f"over whole blocks only (outputs {list(shards)}, inputs {k}); "
                                  "use --quantization fp8")
            weight = {**fp8, "weight_scale_group_size": bk, "weight_scale_group_size_n": bn}
            scale = getattr(layer, self.scale_name).data.to(torch.float32)
        else:
            weight, scale = fp8, self._channel_scales(layer)
        act = None
        if self.act == "dynamic":
            act = {"quant_method": "humming", "a_dtype": "float8e4m3",
                   "input_scale_group_size": self.act_group or 0,
                   "input_quant_mode": "dynamic_group" if self.act_group else "dynamic_token"}
        return weight, {"weight": layer.weight.data.contiguous().view(torch.int32),
                        "weight_scale": scale}, act


def _fp8(cfg: dict) -> HummingFp8:
    base = fp8_method(cfg)
    if base.act == "static":
        raise unsupported("activation_scheme", "static", "humming serves fp8 with dynamic "
                                                         "activations; use --quantization fp8")
    return HummingFp8(weight_scheme=base.weight_scheme, act=base.act, block=base.block,
                      act_group=base.act_group, scale_name=base.scale_name, dtype=base.fp8)


def _gptq(cfg: dict) -> HummingGPTQ:
    base = gptq_method(cfg)
    if base.desc_act:
        raise unsupported("desc_act", True, "humming serves GPTQ without act-order; "
                                            "use --quantization gptq")
    method = HummingGPTQ(base.bits, base.group_size, False, base.zero_offset)
    method.sym = bool(cfg.get("sym", True))
    return method


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("humming", quant_config, ("gptq", "awq", "fp8"))
    kind = str(cfg.get("quant_method")).lower()
    if kind == "fp8":
        return PerLayer(excluding(config_value(cfg, "ignored_layers", "modules_to_not_convert",
                                               default=[]), _fp8(cfg)))
    if kind == "awq":
        base = awq_method(cfg)
        return PerLayer(excluding(config_value(cfg, "modules_to_not_convert", default=[]),
                                  HummingAWQ(base.group_size)))
    if cfg.get("lm_head"):
        raise unsupported("lm_head", True, "a quantized output head is not served")
    return PerLayer(excluding(gptq_exclusions(cfg), _gptq(cfg)))
