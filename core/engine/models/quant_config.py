"""Where a checkpoint says how it is quantized, normalized to one ``quantization_config`` dict
whose ``quant_method`` names a ``--quantization`` choice.

Read in order: ``config.json``'s ``quantization_config``; ``quantize_config.json`` or
``quant_config.json`` beside the weights (AutoGPTQ/AutoAWQ: ``quant_method`` inferred when the
file omits it); ModelOpt's ``hf_quant_config.json`` (its ``quantization`` block, method
``modelopt``); mlx-community's ``quantization`` block in ``config.json`` (``mlx_q4`` /
``mlx_q8``); Ascend msModelSlim's ``quant_model_description.json`` (``modelslim``: each
tensor's type). A file that cannot be read, or an mlx bit width no choice serves, is a
:class:`ConfigError` naming the file and field.
"""

from __future__ import annotations

import json
import os
from typing import Any

from engine.errors import ConfigError

#: mlx bit width -> the choice serving it
MLX_CHOICES = {4: "mlx_q4", 8: "mlx_q8"}


def _read(path: str) -> dict[str, Any] | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def _gptq_or_awq(data: dict[str, Any]) -> str:
    return "awq" if {"w_bit", "q_group_size", "zero_point"} & set(data) else "gptq"


def read_quant_config(model_path: str, declared: Any = None) -> dict[str, Any] | None:
    """The checkpoint's quantization config (``declared``: config.json's
    ``quantization_config`` as parsed), or ``None`` for a dense checkpoint."""
    if declared:
        cfg = dict(declared) if isinstance(declared, dict) else dict(declared.to_dict())
        if "quant_method" not in cfg:
            cfg["quant_method"] = _gptq_or_awq(cfg)
        cfg["quant_method"] = str(cfg["quant_method"]).lower()
        return cfg
    if not os.path.isdir(model_path):
        return None
    for fname in ("quantize_config.json", "quant_config.json"):
        data = _read(os.path.join(model_path, fname))
        if data is not None:
            data.setdefault("quant_method", _gptq_or_awq(data))
            data["quant_method"] = str(data["quant_method"]).lower()
            data["config_file"] = fname
            return data
    data = _read(os.path.join(model_path, "quant_model_description.json"))
    if data is not None:  # Ascend msModelSlim: each tensor's quantization type
        return {"quant_method": "modelslim", "model_quant_type": data.get("model_quant_type"),
                "description": data, "config_file": "quant_model_description.json"}
    data = _read(os.path.join(model_path, "hf_quant_config.json"))
    if data is not None:
        block = data.get("quantization")
        if not isinstance(block, dict) or "quant_algo" not in block:
            raise ConfigError(f"{model_path}/hf_quant_config.json: no quantization.quant_algo")
        return {"quant_method": "modelopt", **block, "producer": data.get("producer"),
                "config_file": "hf_quant_config.json"}
    mlx = (_read(os.path.join(model_path, "config.json")) or {}).get("quantization")
    if isinstance(mlx, dict) and "bits" in mlx:
        bits = mlx.get("bits")
        if bits not in MLX_CHOICES:
            raise ConfigError(f"{model_path}/config.json: quantization.bits = {bits}: mlx "
                              "checkpoints are served at 4 bits (mlx_q4) or 8 bits (mlx_q8)")
        return {"quant_method": MLX_CHOICES[bits], "bits": bits,
                "group_size": mlx.get("group_size", 64), "mode": mlx.get("mode", "affine")}
    return None
