"""The ``gguf`` quantization method: each linear layer keeps its GGUF blocks packed and, for up to
``--gguf-kernel-max-rows`` tokens (every decode step), multiplies straight from them; larger
batches (long prefills) use a dequantized copy, where dense matrix products are faster.

Only the weight stays quantized: activations and accumulation are float32, so the products are
those of the dequantized weights up to summation order.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.api import ConfigError, PluginError
from engine.api import hookimpl
from engine.api.quant import Linear, PackedWeight, QuantMethod, rowwise

from engine_quant_gguf import kernels


class GGUFMethod(QuantMethod):
    """Dense ``weight`` (filled by dequantizing) plus ``gguf_blocks`` [out, row_bytes] uint8 when
    every row of the layer came packed in one type the kernels read.

    The kernels are batch-invariant: each output element is accumulated by one thread, over the
    blocks of its row in order, in per-row registers (threads split the output columns, never
    the reduction), so a row's result never depends on the other rows. ``batch_invariant``
    (``--enable-deterministic-inference``) therefore multiplies every row count from the packed
    blocks, and a layer without blocks one row at a time.
    """

    def __init__(self, max_rows: int, batch_invariant: bool = False) -> None:
        self.max_rows = max_rows if not batch_invariant else 2**62
        self.batch_invariant = batch_invariant

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        param = nn.Parameter(torch.empty((out_features, in_features), dtype=dtype),
                             requires_grad=False)
        param.weight_loader = functools.partial(self._load, layer)
        layer.register_parameter("weight", param)
        layer.gguf_shards = {}  # row offset -> PackedWeight, until loading ends
        layer.register_buffer("gguf_blocks", None, persistent=False)
        layer.gguf_qtype = 0

    @staticmethod
    def _load(layer: Linear, param: nn.Parameter, tensor: Any, offset: int,
              size: int | None) -> None:
        dst = param.data if size is None else param.data.narrow(0, offset, size)
        if isinstance(tensor, PackedWeight):
            qtype = kernels.QTYPES.get(tensor.qtype)
            if qtype is None:
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
        if len(qtypes) != 1 or sum(s.shape[0] for s in shards.values()) != layer.out_features:
            return  # mixed or unsupported types: this layer stays dense
        blocks = torch.cat([shards[o].data for o in sorted(shards)]).contiguous()
        layer.gguf_blocks = blocks
        layer.gguf_qtype = kernels.QTYPES[qtypes.pop()]

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        blocks = layer.gguf_blocks
        rows = x.numel() // layer.in_features
        if blocks is None and self.batch_invariant:
            return rowwise(lambda row: F.linear(row, layer.weight, bias), x)
        if blocks is None or not 0 < rows <= self.max_rows:
            return F.linear(x, layer.weight, bias)
        flat = x.reshape(rows, layer.in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        y = kernels.matmul(layer.gguf_qtype, blocks, layer.out_features, flat)
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
    types = set((quant_config or {}).get("weight_types", kernels.QTYPES))
    if not types & set(kernels.QTYPES):
        raise PluginError(f"--quantization gguf: kernels read {', '.join(kernels.QTYPES)}; this "
                          f"file's weights are {', '.join(sorted(types))}")
    kernels.library()  # compile now, so a toolchain problem stops start-up with its reason
    max_rows = int(options["gguf_kernel_max_rows"])
    return GGUFMethod(max_rows, batch_invariant=config.enable_deterministic_inference)
