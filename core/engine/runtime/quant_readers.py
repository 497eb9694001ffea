"""Readers of each checkpoint format's quantization config: they turn ``quantization_config``
fields into the layer methods of :mod:`engine.runtime.quant_schemes` (unsupported values are
one-line :class:`ConfigError`s naming the field)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from engine.runtime.quant_methods import (Fp8Method, Int8Method, LayerMethod, MXFP4Method,
                                          MXFP8Method, _matches, checkpoint_names, config_value,
                                          is_excluded, unsupported)
from engine.runtime.quant_schemes import (AWQMethod, GPTQMethod, IntWeightOnlyMethod,
                                          NVFP4WeightMethod, PackQuantizedMethod, excluding)



def _bits(cfg: dict, allowed: tuple[int, ...], fmt: str) -> int:
    bits = config_value(cfg, "bits", "w_bit", "num_bits", default=4)
    if bits not in allowed:
        raise unsupported("bits", bits, f"{fmt} is served at {' or '.join(map(str, allowed))} "
                                         "bits")
    return int(bits)


def gptq_method(cfg: dict) -> GPTQMethod:
    bits = _bits(cfg, (2, 4, 8), "gptq")
    fmt = str(cfg.get("checkpoint_format", "gptq"))
    if fmt not in ("gptq", "gptq_v2") or cfg.get("is_marlin_format"):
        raise unsupported("checkpoint_format", fmt, "gptq v1 and v2 layouts are served (a "
                                                     "Marlin-repacked checkpoint is not)")
    return GPTQMethod(bits, int(config_value(cfg, "group_size", default=128)),
                      bool(cfg.get("desc_act", False)), 0 if fmt == "gptq_v2" else 1)


def gptq_exclusions(cfg: dict) -> list[str]:
    """GPTQModel ``dynamic`` rules that skip modules (``-:`` regexes); other overrides refuse."""
    skips = []
    for rule, override in (cfg.get("dynamic") or {}).items():
        if rule.startswith("-:"):
            skips.append("re:" + rule[2:])
        elif override:
            raise unsupported("dynamic", rule, "per-module overrides of bits or groups are not "
                                               "served; only '-:' (skip) rules")
    return skips


def awq_method(cfg: dict) -> AWQMethod:
    _bits(cfg, (4,), "awq")
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise unsupported("version", version, "the AWQ GEMM layout is served")
    return AWQMethod(int(config_value(cfg, "group_size", "q_group_size", default=128)))


def fp8_method(cfg: dict | None) -> Fp8Method:
    """``quant_method: fp8`` (block ``weight_block_size`` with ``weight_scale_inv``, or
    per-tensor ``weight_scale`` with dynamic/static activations); ``None``: online."""
    if cfg is None:
        return Fp8Method(weight_scheme="channel", act="dynamic", online=True)
    act = str(cfg.get("activation_scheme", "dynamic"))
    if act not in ("dynamic", "static"):
        raise unsupported("activation_scheme", act, "dynamic or static")
    block = cfg.get("weight_block_size")
    if block is not None:
        if act != "dynamic" or len(block) != 2:
            raise unsupported("weight_block_size", block, "[block_n, block_k] with dynamic "
                                                          "activations")
        return Fp8Method(weight_scheme="block", block=(int(block[0]), int(block[1])),
                         act_group=int(block[1]), scale_name="weight_scale_inv")
    return Fp8Method(weight_scheme="tensor", act=act)


def _fp8_dtype(name: Any) -> torch.dtype:
    if name in (None, "fp8_e4m3", "float8_e4m3fn", "e4m3"):
        return torch.float8_e4m3fn
    if name in ("fp8_e5m2", "float8_e5m2", "e5m2"):
        return torch.float8_e5m2
    raise unsupported("dtype", name, "fp8_e4m3 or fp8_e5m2 weights")


def ct_group_method(group: dict, fmt: str) -> LayerMethod:
    """One compressed-tensors ``config_groups`` entry as a layer method."""
    w, a = group.get("weights") or {}, group.get("input_activations")
    fmt = group.get("format") or fmt
    wtype, bits, strategy = w.get("type", "int"), w.get("num_bits"), w.get("strategy")
    where = "config_groups.weights"
    if w.get("dynamic"):
        raise unsupported(f"{where}.dynamic", True, "weights must be stored quantized")
    if wtype == "float" and bits == 8:
        act, group_k = _ct_fp8_act(a)
        if strategy == "block":
            bs = w.get("block_structure") or [128, 128]
            return Fp8Method(weight_scheme="block", block=(int(bs[0]), int(bs[1])), act=act,
                             act_group=group_k)
        if strategy not in ("tensor", "channel"):
            raise unsupported(f"{where}.strategy", strategy, "fp8 weights per tensor, channel "
                                                            "or block")
        return Fp8Method(weight_scheme=strategy, act=act, act_group=group_k)
    if wtype != "int":
        raise unsupported(f"{where}.type", f"{wtype}{bits}", "int and fp8 schemes are served "
                          "(nvfp4/mxfp4 compressed-tensors linears are not)")
    if a is not None:
        if bits != 8 or a.get("num_bits") != 8 or a.get("type", "int") != "int":
            raise unsupported("config_groups.input_activations", a, "int W8A8 is the served "
                                                                  "activation-quantized int scheme")
        if not w.get("symmetric", True) or strategy != "channel":
            raise unsupported(f"{where}.strategy", strategy, "W8A8 int8 weights are symmetric "
                                                            "per channel")
        if not a.get("symmetric", True):
            raise unsupported("config_groups.input_activations.symmetric", False,
                              "int8 activations are symmetric")
        return Int8Method(act="dynamic" if a.get("dynamic") else "static")
    gsize = -1 if strategy == "channel" else int(w.get("group_size") or -1)
    if fmt == "pack-quantized":
        if bits not in (4, 8):
            raise unsupported(f"{where}.num_bits", bits, "pack-quantized is served at 4 or 8 "
                                                        "bits")
        return PackQuantizedMethod(bits, gsize, bool(w.get("symmetric", True)),
                                   w.get("actorder") == "group")
    if fmt in ("int-quantized", "naive-quantized") and bits == 8 and w.get("symmetric", True):
        return IntWeightOnlyMethod(gsize)
    raise unsupported("format", fmt, f"int{bits} weight-only is served pack-quantized (4/8 bits)"
                                     " or int-quantized (8 bits, symmetric)")


def _ct_fp8_act(a: dict | None) -> tuple[str | None, int | None]:
    if a is None:
        return None, None
    if a.get("type", "float") != "float" or a.get("num_bits") != 8:
        raise unsupported("config_groups.input_activations", a, "fp8 activations with fp8 "
                                                              "weights")
    strategy = a.get("strategy")
    if a.get("dynamic"):
        if strategy == "group":
            return "dynamic", int(a.get("group_size") or 128)
        return "dynamic", None
    if strategy != "tensor":
        raise unsupported("config_groups.input_activations.strategy", strategy,
                          "static fp8 activations are per tensor")
    return "static", None


def compressed_tensors_scheme(cfg: dict) -> Callable[[str], LayerMethod | None]:
    """The per-layer methods of a compressed-tensors config (``config_groups`` targets, the
    ``ignore`` list)."""
    fmt = cfg.get("format", "")
    groups = [(g.get("targets") or [], ct_group_method(g, fmt))
              for g in (cfg.get("config_groups") or {}).values()]
    if not groups:
        raise unsupported("config_groups", {}, "at least one quantization group")
    ignore = list(cfg.get("ignore") or [])

    def scheme(name: str) -> LayerMethod | None:
        if is_excluded(name, ignore):
            return None
        for targets, method in groups:
            if any(t == "Linear" or all(_matches(p, t) for p in checkpoint_names(name))
                   for t in targets):
                return method
        return None
    return scheme


#: how Quark spells an MXFP4 (E2M1) ``dtype``
MXFP4_DTYPES = ("fp4", "mxfp4", "fp4_e2m1")


def _quark_mxfp4(w: dict, a: dict | None) -> LayerMethod:
    """Quark MXFP4: E2M1 weights per group of 32 with e8m0 scales; activations dynamic MXFP4
    (W4A4) or none (W4A16)."""
    field = "global_quant_config.weight"
    if w.get("qscheme", "per_group") != "per_group" or int(w.get("group_size", 32)) != 32:
        raise unsupported(f"{field}.qscheme", (w.get("qscheme"), w.get("group_size")),
                          "MXFP4 per_group with group_size 32")
    if str(w.get("scale_format", "e8m0")).lower() != "e8m0":
        raise unsupported(f"{field}.scale_format", w.get("scale_format"), "MXFP4 e8m0 scales")
    if a is not None:
        if str(a.get("dtype", "")).lower() not in MXFP4_DTYPES:
            raise unsupported("global_quant_config.input_tensors.dtype", a.get("dtype"),
                              "MXFP4 activations (W4A8 MXFP4-FP8 is a MoE scheme)")
        if not a.get("is_dynamic", True):
            raise unsupported("global_quant_config.input_tensors.is_dynamic", False,
                              "dynamic MXFP4 activations")
    return MXFP4Method(act="mxfp4" if a is not None else None)


def quark_scheme(cfg: dict) -> Callable[[str], LayerMethod | None]:
    """Quark's ``global_quant_config``: fp8 weights (per tensor or channel) with static or
    dynamic fp8 activations, or MXFP4 weights with dynamic MXFP4 activations (or none);
    ``exclude`` layers stay dense."""
    g = cfg.get("global_quant_config") or {}
    w, a = g.get("weight") or {}, g.get("input_tensors")
    if cfg.get("layer_quant_config"):
        raise unsupported("layer_quant_config", "...", "one global scheme is served")
    if str(w.get("dtype", "")).lower() in MXFP4_DTYPES:
        return excluding(cfg.get("exclude"), _quark_mxfp4(w, a))
    dtype = _fp8_dtype(w.get("dtype"))
    qscheme = w.get("qscheme", "per_tensor")
    if qscheme not in ("per_tensor", "per_channel"):
        raise unsupported("global_quant_config.weight.qscheme", qscheme,
                          "fp8 per_tensor or per_channel")
    act = None if a is None else ("dynamic" if a.get("is_dynamic") else "static")
    if a is not None:
        _fp8_dtype(a.get("dtype"))
        if act == "static" and a.get("qscheme", "per_tensor") != "per_tensor":
            raise unsupported("global_quant_config.input_tensors.qscheme", a.get("qscheme"),
                              "static activations per tensor")
    method = Fp8Method(weight_scheme="tensor" if qscheme == "per_tensor" else "channel",
                       act=act, dtype=dtype)
    return excluding(cfg.get("exclude"), method)


def modelopt_scheme(cfg: dict, algos: tuple[str, ...]) -> Callable[[str], LayerMethod | None]:
    """ModelOpt ``quant_algo`` ``FP8`` (per-tensor weights, static per-tensor activations),
    ``MXFP8`` (:class:`MXFP8Method`) or ``NVFP4``/``W4A16_NVFP4`` (weights only:
    :class:`NVFP4WeightMethod`)."""
    algo = str(cfg.get("quant_algo", "")).upper()
    if algo not in algos:
        raise unsupported("quant_algo", algo, f"this choice serves {', '.join(algos)}")
    method: LayerMethod = (Fp8Method(weight_scheme="tensor", act="static") if algo == "FP8"
                           else MXFP8Method() if algo == "MXFP8" else NVFP4WeightMethod())
    return excluding(config_value(cfg, "exclude_modules", "ignore", default=[]), method)


