"""Per-layer scales of an fp8 KV cache: from the checkpoint's tensors, or from the JSON file of
``--quantization-param-path``.

A layer's K (V) is stored as ``k / k_scale`` in fp8 and read back times ``k_scale``. The
checkpoint names them per format (compressed-tensors ``self_attn.k_scale``, ModelOpt
``k_proj.k_scale``, Quark ``k_proj.output_scale``, the legacy ``self_attn.kv_scale`` for both);
a layer with only one of the two uses it for both, and a layer with neither uses 1.0. The file
holds one scale per layer for k and v alike::

    {"model_type": "llama",                      (optional: must name the model's type)
     "kv_cache": {"dtype": "float8_e4m3fn",      (the --kv-cache-dtype it was made for)
                  "scaling_factor": {"0": {"0": 0.04, "1": 0.05, ...}}}}

``scaling_factor`` maps each tensor-parallel rank to its layers (one rank here: ``"0"``), and
every layer of the model must be there. Anything else is a :class:`ConfigError` naming the
field.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from engine.errors import ConfigError

#: a checkpoint tensor name -> (layer, "k" | "v" | "kv")
_NAME = re.compile(r"layers\.(\d+)\..*?(?:(kv)_scale|(k|v)_scale|(k|v)_proj\.(?:k_scale|v_scale"
                   r"|output_scale))$")

#: --kv-cache-dtype -> the dtype a scale file names for it
FILE_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def checkpoint_scales(named: dict[str, float], num_layers: int
                      ) -> tuple[dict[int, float], dict[int, float]]:
    """The k and v scales by layer that the checkpoint's scale tensors ``named`` give (a
    layer with one of the two: that one for both; names of layers past ``num_layers``, or
    scales that are not positive, are skipped)."""
    k: dict[int, float] = {}
    v: dict[int, float] = {}
    for name, value in named.items():
        m = _NAME.search(name)
        if not m or not value > 0 or not math.isfinite(value):
            continue
        layer = int(m.group(1))
        if layer >= num_layers:
            continue
        which = m.group(2) or m.group(3) or m.group(4)
        if "k" in which:
            k[layer] = value
        if "v" in which:
            v[layer] = value
    for layer in set(k) | set(v):
        k.setdefault(layer, v.get(layer, 1.0))
        v.setdefault(layer, k[layer])
    return k, v


def scale_file(path: str, num_layers: int, kv_cache_dtype: str,
               model_type: str | None = None) -> list[float]:
    """The per-layer scales of the ``--quantization-param-path`` file at ``path`` for a model
    of ``num_layers`` layers (of ``model_type``) and the fp8 ``kv_cache_dtype``."""
    flag = "--quantization-param-path"
    try:
        with open(path, encoding="utf-8") as fh:
            data: Any = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{flag} {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("kv_cache"), dict):
        raise ConfigError(f"{flag} {path}: needs an object with a \"kv_cache\" object")
    file_type = data.get("model_type")
    if file_type is not None and model_type is not None and file_type != model_type:
        raise ConfigError(f"{flag} {path}: model_type is {file_type!r}, the model is "
                          f"{model_type!r}")
    kv = data["kv_cache"]
    want = FILE_DTYPES[kv_cache_dtype]
    if kv.get("dtype") != want:
        raise ConfigError(f"{flag} {path}: kv_cache.dtype is {kv.get('dtype')!r}; "
                          f"--kv-cache-dtype {kv_cache_dtype} needs {want!r}")
    ranks = kv.get("scaling_factor")
    if not isinstance(ranks, dict) or not ranks:
        raise ConfigError(f"{flag} {path}: kv_cache.scaling_factor must map tensor-parallel "
                          f"ranks to their layers' scales")
    if set(map(str, ranks)) != {"0"}:
        raise ConfigError(f"{flag} {path}: kv_cache.scaling_factor has ranks "
                          f"{sorted(map(str, ranks))}; this server runs one rank (\"0\")")
    layers = next(iter(ranks.values()))
    if not isinstance(layers, dict):
        raise ConfigError(f"{flag} {path}: kv_cache.scaling_factor.0 must map layers to scales")
    scales: dict[int, float] = {}
    for key, value in layers.items():
        field = f"kv_cache.scaling_factor.0.{key}"
        try:
            layer = int(key)
        except (TypeError, ValueError):
            raise ConfigError(f"{flag} {path}: {field}: not a layer index") from None
        if not 0 <= layer < num_layers:
            raise ConfigError(f"{flag} {path}: {field}: the model has layers 0-{num_layers - 1}")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"{flag} {path}: {field} is {value!r}, not a positive number")
        scales[layer] = float(value)
    missing = [i for i in range(num_layers) if i not in scales]
    if missing:
        raise ConfigError(f"{flag} {path}: kv_cache.scaling_factor.0 has no scale for layers "
                          f"{_ranges(missing)} (the model has {num_layers})")
    return [scales[i] for i in range(num_layers)]


def model_type(model_path: str) -> str | None:
    """The ``model_type`` of the model directory's ``config.json`` (None: none to read)."""
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as fh:
            value = json.load(fh).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    start = prev = ids[0]
    for i in ids[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out)
