"""The ``gguf`` quantization method: each linear layer keeps its GGUF blocks packed and, for up to
``--gguf-kernel-max-rows`` tokens (every decode step), multiplies straight from them; larger
batches (long prefills) use a dequantized copy, where dense matrix products are faster.

Q4_0/Q4_1/Q8_0 layers keep activations and accumulation in float32, so their products are those
of the dequantized weights up to summation order. K-quant layers (Q2_K..Q6_K) quantize each
activation row to 8 bits per 256 values and take integer dot products, as llama.cpp does.
Types the kernels do not read (Q5_0, Q5_1, IQ*...) are dequantized at load.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.api import ConfigError, PluginError
from engine.api import hookimpl
from engine.api.quant import Linear, PackedWeight, QuantMethod, rowwise

from engine_quant_gguf import kernels

log = logging.getLogger("engine.quant.gguf")


class GGUFMethod(QuantMethod):
    """Dense ``weight`` (filled by dequantizing) plus ``gguf_blocks`` [out, row_bytes] uint8 when
    every row of the layer came packed in one type the kernels read, or ``gguf_parts`` (row
    offset, rows, type id, blocks), one per run of shards of one type, when a fused layer's shards
    came in different packed types (Q4_K_M files: attn_q/attn_k in Q4_K, attn_v in Q6_K); then
    one kernel call per part writes its columns of the output.

    The kernels are batch-invariant: each output element is accumulated by one thread, over the
    blocks of its row in order, in per-row registers (threads split the output columns, never
    the reduction), so a row's result never depends on the other rows. ``batch_invariant``
    (``--enable-deterministic-inference``) therefore multiplies every row count from the packed
    blocks, and a layer without blocks one row at a time.
    """

    def __init__(self, max_rows: int, batch_invariant: bool = False) -> None:
        self.max_rows = max_rows if not batch_invariant else 2**62
        self.batch_invariant = batch_invariant
        self._dequantized_types: set[str] = set()  # types already reported as dequantized

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        param = nn.Parameter(torch.empty((out_features, in_features), dtype=dtype),
                             requires_grad=False)
        param.weight_loader = functools.partial(self._load, layer)
        layer.register_parameter("weight", param)
        layer.gguf_shards = {}  # row offset -> PackedWeight, until loading ends
        layer.register_buffer("gguf_blocks", None, persistent=False)
        layer.gguf_qtype = 0
        layer.gguf_parts = []

    def _load(self, layer: Linear, param: nn.Parameter, tensor: Any, offset: int,
              size: int | None) -> None:
        dst = param.data if size is None else param.data.narrow(0, offset, size)
        if isinstance(tensor, PackedWeight):
            qtype = kernels.PACKED.get(tensor.qtype)
            if qtype is None:
                if tensor.qtype not in self._dequantized_types:
                    self._dequantized_types.add(tensor.qtype)
                    log.info("gguf: %s weights are not served packed (kernels read %s); their "
                             "layers are dequantized to float32 at load", tensor.qtype,
                             ", ".join(kernels.PACKED))
                tensor = tensor.dequantize()
            else:
                layer.gguf_shards[offset] = tensor
                tensor = kernels.dequantize(qtype, tensor.data, *tensor.shape)
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ConfigError(f"gguf: a weight of shape {tuple(tensor.shape)} does not fit "
                              f"rows {offset}..{offset + dst.shape[0]} of {layer}")
        dst.copy_(tensor)

    def process_weights_after_loading(self, layer: Linear) -> None:
        shards: dict[int, PackedWeight] = layer.__dict__.pop("gguf_shards", {})
        qtypes = {s.qtype for s in shards.values()}
        if not qtypes or sum(s.shape[0] for s in shards.values()) != layer.out_features:
            return  # rows in types the kernels do not read: this layer stays dense
        if len(qtypes) > 1:  # fused shards of different types: one kernel call per run of a type
            parts: list[tuple[int, int, int, torch.Tensor]] = []
            for o, s in sorted(shards.items()):
                qtype = kernels.PACKED[s.qtype]
                if parts and parts[-1][2] == qtype:
                    po, prows, _, pdata = parts.pop()
                    parts.append((po, prows + s.shape[0], qtype, torch.cat([pdata, s.data])))
                else:
                    parts.append((o, s.shape[0], qtype, s.data.contiguous()))
            layer.gguf_parts = parts
            return
        blocks = torch.cat([shards[o].data for o in sorted(shards)]).contiguous()
        layer.gguf_blocks = blocks
        layer.gguf_qtype = kernels.PACKED[qtypes.pop()]

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        blocks, parts = layer.gguf_blocks, layer.gguf_parts
        packed = blocks is not None or bool(parts)
        rows = x.numel() // layer.in_features
        if not packed and self.batch_invariant:
            return rowwise(lambda row: F.linear(row, layer.weight, bias), x)
        if not packed or not 0 < rows <= self.max_rows:
            return F.linear(x, layer.weight, bias)
        flat = x.reshape(rows, layer.in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        if blocks is not None:
            y = kernels.matmul(layer.gguf_qtype, blocks, layer.out_features, flat)
        else:
            y = torch.empty((rows, layer.out_features), dtype=torch.float32)
            for offset, size, qtype, data in parts:
                kernels.matmul(qtype, data, size, flat, out=y[:, offset:offset + size])
        if bias is not None:
            y += bias
        return y.to(x.dtype).reshape(*x.shape[:-1], layer.out_features)


@hookimpl
def engine_create_quant_method(model_config: Any, quant_config: Any, device: torch.device,
                               options: Any, config: Any) -> QuantMethod:
    if device.type != "cpu":
        raise PluginError(f"--quantization gguf: its kernels run on the CPU; this model is on "
                          f"{device.type}")
    if model_config.weights_format != "gguf":
        raise PluginError("--quantization gguf: needs a .gguf checkpoint (this one is "
                          f"{model_config.weights_format})")
    types = set((quant_config or {}).get("weight_types", kernels.PACKED))
    if not types & set(kernels.PACKED):
        raise PluginError(f"--quantization gguf: kernels read {', '.join(kernels.PACKED)}; this "
                          f"file's weights are {', '.join(sorted(types))}")
    kernels.library()  # compile now, so a toolchain problem stops start-up with its reason
    max_rows = int(options["gguf_kernel_max_rows"])
    return GGUFMethod(max_rows, batch_invariant=config.enable_deterministic_inference)
