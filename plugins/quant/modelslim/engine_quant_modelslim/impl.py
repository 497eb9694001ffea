"""``--quantization modelslim``: Ascend msModelSlim checkpoints, whose
``quant_model_description.json`` gives each tensor's type (emulated: see the manifest)."""

from typing import Any, Iterator

import torch

from engine.api import ConfigError, hookimpl
from engine.api.quant import (ModelSlimDynamicMethod, ModelSlimW8A8Method, PerLayer,
                              QuantMethod, checkpoint_names, claim)


#: description type -> the layer method computing it
TYPES = {"W8A8": ModelSlimW8A8Method(), "W8A8_DYNAMIC": ModelSlimDynamicMethod(8),
         "W4A4_DYNAMIC": ModelSlimDynamicMethod(4)}


def _float32_deq_scale(weights: Iterator[Any]) -> Iterator[Any]:
    """``deq_scale`` stored as int64 words (float16 models) -> the float32 values they hold."""
    for name, tensor in weights:
        if name.endswith(".deq_scale") and tensor.dtype == torch.int64:
            tensor = (tensor & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
        yield name, tensor


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("modelslim", quant_config, ("modelslim",))
    desc = cfg.get("description") or {}
    file = cfg.get("config_file", "quant_model_description.json")
    if str(desc.get("lm_head.weight", "FLOAT")).upper() != "FLOAT":
        raise ConfigError(f"{file}: lm_head.weight = {desc['lm_head.weight']!r}: a quantized "
                          "output head is not served")

    def scheme(name: str):
        if name.endswith(".experts"):
            if any(k.startswith(name + ".") and str(v).upper() != "FLOAT"
                   for k, v in desc.items()):
                raise ConfigError(f"{file}: {name} are quantized; routed experts of msModelSlim "
                                  "checkpoints are not served in this build")
            return None
        kinds = {str(desc.get(f"{part}.weight", "FLOAT")).upper()
                 for part in checkpoint_names(name)}
        if len(kinds) > 1:
            raise ConfigError(f"{file}: the parts of {name} have different types "
                              f"({', '.join(sorted(kinds))}); a fused layer is quantized whole")
        kind = kinds.pop()
        if kind == "FLOAT":
            return None
        if kind not in TYPES:
            raise ConfigError(f"{file}: {checkpoint_names(name)[0]}.weight = {kind!r}: served "
                              f"types are {', '.join(TYPES)} and FLOAT")
        return TYPES[kind]

    return PerLayer(scheme, rewrite=_float32_deq_scale)
