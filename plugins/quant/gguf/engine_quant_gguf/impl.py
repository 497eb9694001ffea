"""The ``gguf`` quantization method: each linear layer keeps its GGUF blocks packed (no dense
copy) and multiplies straight from them.

``--gguf-activations int8`` (default): activations quantized per block of 32 to int8, integer
block dot products (llama.cpp's arithmetic), every batch size. ``float32``: float32 activations
and sums, the exact products of the dequantized weights up to summation order, for up to
``--gguf-kernel-max-rows`` tokens; larger batches multiply a dequantized copy made per call.
K-quant layers (Q2_K..Q6_K) always quantize activations to 8 bits per 256 values (kquants.c;
there is no float32 K-quant kernel). Types the kernels do not read (Q5_0, Q5_1, IQ*...) are
dequantized at load.

Where the CPU has AVX512-VNNI, the blocks of every layer whose products are 8-bit ones
(Q4_0/Q4_1/Q8_0 with int8 activations, Q4_K/Q5_K/Q6_K always) are rearranged at load into the
kernels' panel form (``kernels.panelize``; ``ENGINE_GGUF_PANELS=0`` keeps GGUF rows).

With int8 activations, ``--kv-cache-dtype auto`` stores the KV cache in float16 (as llama.cpp
does: half the float32 cache's memory; the attention kernels widen it as they read); with
float32 activations it stays float32.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.api import ConfigError, PluginError
from engine.api import hookimpl
from engine.api.quant import (Linear, NativeKernel, PackedWeight, QuantMethod,
                              UnquantizedMethod, cpu_half_weight, dense_linear,
                              dense_native_kernel, release_pages, rowwise)

from engine_quant_gguf import kernels

log = logging.getLogger("engine.quant.gguf")


class GGUFMethod(QuantMethod):
    """A layer whose rows all came packed in one type the kernels read keeps only its blocks,
    ``gguf_blocks`` [out, row_bytes] uint8 (no dense copy); a fused layer whose shards came in
    different packed types (Q4_K_M files: attn_q/attn_k in Q4_K, attn_v in Q6_K) keeps
    ``gguf_parts`` (row offset, rows, type id, blocks), one per run of shards of one type, and
    runs one kernel call per part into its columns of the output; any other layer gets a dense
    float32 ``weight`` built from its shards (packed ones dequantized) once loading ends, kept
    in 16 bits where its values allow (``cpu_half_weight``: F16 / BF16 tensors).

    ``activations``: ``"int8"`` (default) quantizes each activation row per block of 32 and
    multiplies integers, for every batch size; ``"float32"`` keeps activations and sums float32
    (exact weight products: the outputs equal the dense model's up to summation order) for
    batches of up to ``max_rows`` tokens, and multiplies larger ones with a dequantized copy
    made for that call.

    The kernels are batch-invariant either way: each output element is accumulated by one
    thread, over the blocks of its row in order (threads split the output columns, never the
    reduction), so a row's result never depends on the other rows. ``batch_invariant``
    (``--enable-deterministic-inference``) therefore multiplies every row count from the packed
    blocks, and a layer without blocks one row at a time.
    """

    def __init__(self, max_rows: int, batch_invariant: bool = False,
                 activations: str = "int8") -> None:
        self.max_rows = max_rows if not batch_invariant else 2**62
        self.batch_invariant = batch_invariant
        self.int8 = activations == "int8"
        self.int16 = activations == "int16"  # the head's, with the panel kernels (for_layer)
        # int8 activations are llama.cpp's arithmetic; so is its 16-bit KV cache (half the
        # float32 cache's memory); float32 activations keep the float32 cache (the exact path)
        self.kv_cache_dtype = torch.float16 if self.int8 else None
        self._head: GGUFMethod | None = None
        self._dequantized_types: set[str] = set()  # types already reported as dequantized

    def for_layer(self, name: str) -> "GGUFMethod":
        """The logits head keeps (nearly) float32 activations whatever ``--gguf-activations``
        says: it is where 8-bit rounding showed most (measured on the default model,
        teacher-forced against float32: top-1 agreement 97.2 % -> 97.9 %, KL 0.0031 -> 0.0024
        nats; llama.cpp's: 96.2 %, 0.0028). With the panel kernels its activations are int16
        per block of 32 (rounding ~1e-5 of a block's largest value; integer products, 1.5-2.5x
        the float32 kernel's speed), else float32."""
        if name != "lm_head" or not self.int8:
            return self
        if self._head is None:
            kind = "int16" if kernels.panel_path() else "float32"
            self._head = GGUFMethod(2**62, self.batch_invariant, activations=kind)
        return self._head

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        # a placeholder until loading ends: packed layers never get a dense weight
        param = nn.Parameter(torch.empty((out_features, in_features), dtype=dtype,
                                         device="meta"), requires_grad=False)
        param.weight_loader = functools.partial(self._load, layer)
        layer.register_parameter("weight", param)
        layer.gguf_shards = {}  # row offset -> PackedWeight or dense tensor, until loading ends
        layer.register_buffer("gguf_blocks", None, persistent=False)
        layer.gguf_qtype = 0
        layer.gguf_parts = []
        layer.gguf_panels = False  # blocks of kernels.PANEL_TYPES in the panel form

    @staticmethod
    def _load(layer: Linear, param: nn.Parameter, tensor: Any, offset: int,
              size: int | None) -> None:
        rows = param.shape[0] if size is None else size
        if tuple(tensor.shape) != (rows, param.shape[1]):
            raise ConfigError(f"gguf: a weight of shape {tuple(tensor.shape)} does not fit "
                              f"rows {offset}..{offset + rows} of {layer}")
        layer.gguf_shards[offset] = tensor

    def process_weights_after_loading(self, layer: Linear) -> None:
        shards: dict[int, Any] = layer.__dict__.pop("gguf_shards", {})
        packed = {s.qtype for s in shards.values() if isinstance(s, PackedWeight)}
        whole = sum(s.shape[0] for s in shards.values()) == layer.out_features
        if whole and packed and all(isinstance(s, PackedWeight) for s in shards.values()) \
                and packed <= set(kernels.PACKED):
            if len(packed) == 1:
                datas = [shards[o].data for o in sorted(shards)]
                # one shard: the file's own bytes (a view of the mapped file), no copy
                layer.gguf_blocks = datas[0].contiguous() if len(datas) == 1 else torch.cat(datas)
                if len(datas) > 1:  # the shards' file pages were read into the copy
                    for data in datas:
                        release_pages(data)
                layer.gguf_qtype = kernels.PACKED[packed.pop()]
            else:  # fused shards of different types: one kernel call per run of a type
                parts: list[tuple[int, int, int, torch.Tensor]] = []
                for o, s in sorted(shards.items()):
                    qtype = kernels.PACKED[s.qtype]
                    if parts and parts[-1][2] == qtype:
                        po, prows, _, pdata = parts.pop()
                        parts.append((po, prows + s.shape[0], qtype, torch.cat([pdata, s.data])))
                    else:
                        parts.append((o, s.shape[0], qtype, s.data.contiguous()))
                layer.gguf_parts = parts
            del layer.weight
            layer.weight = None  # the blocks are the weight
            if kernels.panel_path():
                self._panelize(layer, file_view=len(shards) == 1)
            return
        dense = torch.zeros((layer.out_features, layer.in_features), dtype=layer.weight.dtype)
        for offset, s in shards.items():
            if isinstance(s, PackedWeight):
                qtype = kernels.PACKED.get(s.qtype)
                if qtype is None and s.qtype not in self._dequantized_types:
                    self._dequantized_types.add(s.qtype)
                    log.info("gguf: %s weights are not served packed (kernels read %s); their "
                             "layers are dequantized to float32 at load", s.qtype,
                             ", ".join(kernels.PACKED))
                s = (kernels.dequantize(qtype, s.data, *s.shape) if qtype is not None
                     else s.dequantize())
            dense.narrow(0, offset, s.shape[0]).copy_(s)
        half = cpu_half_weight(dense)  # an F16 / BF16 tensor's values: kept in 16 bits
        layer.weight = nn.Parameter(dense if half is None else half, requires_grad=False)

    def _panel_type(self, qtype: int) -> bool:
        """Whether blocks of ``qtype`` take the panel form: the 8-bit products' types (every
        K-quant product is one; Q4_0/Q4_1/Q8_0 with 8-bit activations)."""
        return qtype in kernels.PANEL_TYPES and (self.int8 or self.int16
                                                 or qtype in kernels.KQ_IDS)

    def _panelize(self, layer: Linear, file_view: bool) -> None:
        """Blocks of the panel types into the panel form (kernels.panelize: about the same
        bytes, the 8-bit products 2-4x cheaper); ``file_view``: the blocks were the mapped
        file's own pages, released from the process once copied."""
        k = layer.in_features
        if layer.gguf_blocks is not None:
            if not self._panel_type(layer.gguf_qtype):
                return
            blocks = layer.gguf_blocks
            layer.gguf_blocks = kernels.panelize(layer.gguf_qtype, blocks, layer.out_features,
                                                 k)
            if file_view:
                release_pages(blocks)
        else:
            if not any(self._panel_type(q) for _, _, q, _ in layer.gguf_parts):
                return
            layer.gguf_parts = [(o, r, q, kernels.panelize(q, d, r, k)
                                 if self._panel_type(q) else d)
                                for o, r, q, d in layer.gguf_parts]
        layer.gguf_panels = True

    def dense_weight(self, layer: Linear) -> torch.Tensor:
        """The layer's float32 weight (made now from the blocks of a packed layer)."""
        if layer.gguf_parts:
            return torch.cat([kernels.dequantize(q, data, rows, layer.in_features,
                                                 self._panel(layer, q))
                              for _, rows, q, data in layer.gguf_parts])
        if layer.gguf_blocks is None:
            return layer.weight
        return kernels.dequantize(layer.gguf_qtype, layer.gguf_blocks, layer.out_features,
                                  layer.in_features, self._panel(layer, layer.gguf_qtype))

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        blocks, parts = layer.gguf_blocks, layer.gguf_parts
        if blocks is None and not parts:
            if self.batch_invariant:
                return rowwise(lambda row: dense_linear(row, layer.weight, bias), x)
            return dense_linear(x, layer.weight, bias)
        n = layer.out_features
        if self.int8 and x.dim() == 2 and x.dtype is torch.float32 and x.is_contiguous() \
                and x.shape[0] > 0:  # the decode hot path: straight to the kernels
            y = torch.empty((x.shape[0], n), dtype=torch.float32)
            for offset, size, qtype, data in (parts or ((0, n, layer.gguf_qtype, blocks),)):
                kernel = self._kernel(qtype, self._panel(layer, qtype))  # same arguments
                kernel(qtype, data.data_ptr(), size, layer.in_features, x.data_ptr(),
                       x.shape[0], y.data_ptr() + 4 * offset, n)  # into columns offset..
            return y if bias is None else y.add_(bias)
        rows = x.numel() // layer.in_features
        if rows == 0 or (not self.int8 and rows > self.max_rows):
            return F.linear(x, self.dense_weight(layer).to(x.dtype), bias)
        flat = x.reshape(rows, layer.in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        if blocks is not None:
            y = self._matmul(layer, layer.gguf_qtype, blocks, n, flat)
        else:
            y = torch.empty((rows, n), dtype=torch.float32)
            for offset, size, qtype, data in parts:
                self._matmul(layer, qtype, data, size, flat, out=y[:, offset:offset + size])
        if bias is not None:
            y += bias
        return y.to(x.dtype).reshape(*x.shape[:-1], n)

    def native_kernel(self, layer: Linear) -> NativeKernel | None:
        if layer.gguf_blocks is None and not layer.gguf_parts:  # a dense layer (F16, F32...)
            return dense_native_kernel(layer.weight) if layer.weight is not None else None
        if self.int16:  # the head: the 16-bit panel kernel, up to max_rows rows (as apply)
            qtype = layer.gguf_qtype
            if layer.gguf_blocks is None or not self._panel(layer, qtype) \
                    or qtype in kernels.KQ_IDS:
                return None
            fn = ctypes.cast(kernels.library().engine_gguf_panel_q16, ctypes.c_void_p).value
            return NativeKernel(fn, qtype, layer.gguf_blocks.data_ptr(), self.max_rows)
        if not self.int8:
            return None
        if layer.gguf_blocks is not None:
            return NativeKernel(self._address(layer, layer.gguf_qtype), layer.gguf_qtype,
                                layer.gguf_blocks.data_ptr())
        table = torch.tensor([[offset, size, self._address(layer, qtype), qtype,
                               data.data_ptr()]
                              for offset, size, qtype, data in layer.gguf_parts],
                             dtype=torch.int64)
        layer.gguf_part_table = table  # kept alive with the layer
        fn = kernels.library().engine_gguf_matmul_parts
        return NativeKernel(ctypes.cast(fn, ctypes.c_void_p).value, len(layer.gguf_parts),
                            table.data_ptr())

    def _panel(self, layer: Linear, qtype: int) -> bool:
        """Whether the layer's blocks of ``qtype`` are in the panel form."""
        return layer.gguf_panels and self._panel_type(qtype)

    def _matmul(self, layer: Linear, qtype: int, blocks: torch.Tensor, n: int, x: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
        panel = self._panel(layer, qtype)
        if self.int16 and panel and qtype not in kernels.KQ_IDS:
            return kernels.matmul_q16(qtype, blocks, n, x, out)
        matmul = kernels.matmul_q8 if self.int8 else kernels.matmul
        return matmul(qtype, blocks, n, x, out, panel)

    def _kernel(self, qtype: int, panel: bool):
        """The int8 kernel for blocks of ``qtype`` (one signature for all)."""
        if qtype in kernels.KQ_IDS:
            return self._pkq if panel else self._kq
        return self._pq8 if panel else self._q8

    def _address(self, layer: Linear, qtype: int) -> int:
        """The address of :meth:`_kernel` for the layer's blocks of ``qtype``."""
        fn = self._kernel(qtype, self._panel(layer, qtype))
        return ctypes.cast(fn, ctypes.c_void_p).value

    @functools.cached_property
    def _q8(self):
        return kernels.library().engine_gguf_matmul_q8

    @functools.cached_property
    def _pq8(self):  # the arguments of engine_gguf_matmul_q8, blocks in the panel form
        return kernels.library().engine_gguf_panel_q8

    @functools.cached_property
    def _kq(self):  # the arguments of engine_gguf_matmul_q8
        return kernels.library().engine_gguf_kq_matmul_ld

    @functools.cached_property
    def _pkq(self):  # the same, blocks in the panel form
        return kernels.library().engine_gguf_kq_panel_q8


class GGUFDequantized(UnquantizedMethod):
    """A GGUF checkpoint on a GPU: every block type is dequantized at load (the gguf package's
    arithmetic, the same values as the CPU kernels' float32 path) into a dense weight in the
    model dtype; the product is the dense one."""


@hookimpl
def engine_create_quant_method(model_config: Any, quant_config: Any, device: torch.device,
                               options: Any, config: Any) -> QuantMethod:
    if model_config.weights_format != "gguf":
        raise PluginError("--quantization gguf: needs a .gguf checkpoint (this one is "
                          f"{model_config.weights_format})")
    if device.type == "cuda":
        log.info("gguf on %s: the blocks are dequantized at load (the packed kernels are the "
                 "CPU's)", device)
        return GGUFDequantized()
    if device.type != "cpu":
        raise PluginError(f"--quantization gguf: served on the CPU (packed kernels) and on CUDA "
                          f"GPUs (dequantized at load); this model is on {device.type}")
    types = set((quant_config or {}).get("weight_types", kernels.PACKED))
    if not types & set(kernels.PACKED):
        raise PluginError(f"--quantization gguf: kernels read {', '.join(kernels.PACKED)}; this "
                          f"file's weights are {', '.join(sorted(types))}")
    kernels.library()  # compile now, so a toolchain problem stops start-up with its reason
    max_rows = int(options["gguf_kernel_max_rows"])
    return GGUFMethod(max_rows, batch_invariant=config.enable_deterministic_inference,
                      activations=options["gguf_activations"])
