"""``--quantization auto-round``: AutoRound's GPTQ-packed (v1 zeros) or AWQ-packed tensors;
``extra_config`` layers at 16 bits stay dense."""

from typing import Any

from engine.api import hookimpl
from engine.api.quant import AWQMethod, GPTQMethod, PerLayer, QuantMethod, claim, excluding, unsupported


@hookimpl
def engine_create_quant_method(quant_config: Any) -> QuantMethod:
    cfg = claim("auto-round", quant_config, ("auto-round", "intel/auto-round"))
    if str(cfg.get("data_type", "int")) != "int":
        raise unsupported("data_type", cfg.get("data_type"), "int AutoRound checkpoints")
    bits, group = int(cfg.get("bits", 4)), int(cfg.get("group_size", 128))
    packing = str(cfg.get("packing_format", "auto_round:auto_gptq"))
    skip = [name for name, over in (cfg.get("extra_config") or {}).items()
            if int(over.get("bits", bits)) >= 16]
    if any(int(o.get("bits", bits)) not in (bits, 16) for o in (cfg.get("extra_config") or {}).values()):
        raise unsupported("extra_config", "...", "per-layer bit widths other than the global one")
    if packing.endswith("auto_awq"):
        if bits != 4:
            raise unsupported("bits", bits, "AWQ packing is 4-bit")
        method = AWQMethod(group)
    elif packing in ("auto_round:auto_gptq", "auto_round", "auto_round:gptq"):
        if bits not in (2, 4, 8):
            raise unsupported("bits", bits, "GPTQ packing is served at 2, 4 or 8 bits")
        method = GPTQMethod(bits, group, False, 1)
    else:
        raise unsupported("packing_format", packing, "auto_round:auto_gptq or auto_round:auto_awq")
    return PerLayer(excluding(skip, method))
