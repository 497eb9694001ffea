"""Linear layers whose weights and matmul belong to a :class:`QuantMethod`.

Every projection of a model is a :class:`Linear`. The layer only knows its shapes; the method
creates its parameters (``create_weights``), repacks them once the checkpoint is loaded
(``process_weights_after_loading``) and runs the product (``apply``). Quantization plugins
(family ``quantization``) return their own method; the unquantized one is the default.
"""

from __future__ import annotations

import os

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


#: an activation-quantized format's rounding of the rows a routed expert multiplies, per row:
#: (the rows its gate/up projection multiplies, the rows its down projection multiplies)
ActQuant = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


@dataclass(frozen=True)
class GroupCodes:
    """A linear layer's input handed over already quantized per row and group of ``group``
    columns by the kernel that wrote it (:meth:`QuantMethod.group_codes`): fp8 ``codes`` [M, K]
    and float32 ``scales`` [M, K / group], column-major (as
    :func:`engine.runtime.quant_triton.quant_groups` makes them); ``dtype`` the activations'
    own dtype, the product's output dtype."""

    codes: torch.Tensor
    scales: torch.Tensor
    group: int
    dtype: torch.dtype


class NativeKernel(NamedTuple):
    """A C function computing a layer's product on the CPU (:meth:`QuantMethod.native_kernel`):
    ``int fn(int type, const uint8_t *weight, int64_t n, int64_t k, const float *x, int64_t m,
    float *y, int64_t ldy)`` (y [m, n], rows ``ldy`` apart, = x [m, k] @ W^T; 0 on success),
    called with ``type`` and ``weight`` (an address). ``rows``: the most rows of x for which
    it equals :meth:`QuantMethod.apply` bit for bit (``None``: any)."""

    fn: int
    type: int
    weight: int
    rows: int | None = None


@dataclass(frozen=True)
class PackedWeight:
    """A checkpoint tensor still in its file's block-quantized layout.

    ``data`` is uint8 ``[rows, row_bytes]`` (one row of blocks per output feature), ``qtype`` the
    format's type name (GGUF: ``"Q4_1"``, ``"Q8_0"``...), ``shape`` the logical ``[rows, cols]``.
    Loaders yield these for quantized GGUF tensors; a parameter without a ``weight_loader``
    receives :meth:`dequantize`'s float32 tensor, so only quantization methods that read the
    packed blocks ever see this type.
    """

    data: torch.Tensor
    qtype: str
    shape: tuple[int, int]

    def dequantize(self) -> torch.Tensor:
        """The float32 values, ``shape``-shaped."""
        import gguf

        from engine.errors import ConfigError

        try:
            array = gguf.dequantize(self.data.numpy(), gguf.GGMLQuantizationType[self.qtype])
        except NotImplementedError:
            raise ConfigError(f"GGUF quantization {self.qtype}: the gguf package cannot "
                              "dequantize it") from None
        return torch.from_numpy(array.reshape(self.shape))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 ``[len(ids), cols]``: rows ``ids`` alone, dequantized (bit for bit the same
        values as those rows of :meth:`dequantize`)."""
        return dequantize_rows(self.qtype, self.data.index_select(0, ids.reshape(-1)),
                               self.shape[1])

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "PackedWeight":
        """The same weight with its rows rearranged by ``fn`` (which sees ``data``)."""
        return PackedWeight(fn(self.data).contiguous(), self.qtype, self.shape)


def _q8_0_rows(blocks: torch.Tensor, cols: int) -> torch.Tensor:
    """GGUF Q8_0 (per 32 values: a float16 scale, then 32 int8): ``q * d`` in float32, the
    gguf package's arithmetic."""
    b = blocks.reshape(blocks.shape[0], cols // 32, 34)
    d = b[..., :2].view(torch.float16).float()
    return (b[..., 2:].view(torch.int8).float() * d).reshape(blocks.shape[0], cols)


#: GGUF types whose rows :func:`dequantize_rows` decodes with torch ops (others: the gguf
#: package, on the selected rows only)
_ROW_DEQUANTIZERS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {"Q8_0": _q8_0_rows}


def dequantize_rows(qtype: str, blocks: torch.Tensor, cols: int) -> torch.Tensor:
    """float32 ``[rows, cols]`` of ``blocks`` (uint8 ``[rows, row_bytes]`` of GGUF type
    ``qtype``)."""
    fn = _ROW_DEQUANTIZERS.get(qtype)
    if fn is not None:
        return fn(blocks, cols)
    return PackedWeight(blocks.contiguous(), qtype, (blocks.shape[0], cols)).dequantize()


class Embedding(nn.Module):
    """Token embeddings ``[vocab, hidden]``: ``forward(ids)`` -> ``[..., hidden]``.

    The ``weight`` is dense unless it arrives as a :class:`PackedWeight` (a quantized GGUF
    table) on the CPU while ``keep_packed`` is set: then the blocks are kept as they came (a
    view of the memory-mapped file) and each forward dequantizes only the rows it looks up,
    which gives the same values as the dense table. The model clears ``keep_packed`` when something reads the
    dense table itself (a tied output head without its own quantization method).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.keep_packed = True
        self.packed: PackedWeight | None = None
        weight = nn.Parameter(torch.empty((num_embeddings, embedding_dim), dtype=dtype),
                              requires_grad=False)
        weight.weight_loader = self._load
        self.weight = weight
        self._dtype = dtype

    def _load(self, param: nn.Parameter, tensor: Any, offset: int, size: int | None) -> None:
        from engine.errors import ConfigError

        expected = (self.num_embeddings, self.embedding_dim)
        if isinstance(tensor, PackedWeight) and self.keep_packed and param.device.type == "cpu":
            if tuple(tensor.shape) != expected:
                raise ConfigError(f"shape {tuple(tensor.shape)}, expected {expected}")
            self.packed = tensor
            # the dense table is never allocated: an empty stand-in keeps the parameter's name
            param.data = torch.empty((0, self.embedding_dim), dtype=param.dtype,
                                     device=param.device)
            return
        if isinstance(tensor, PackedWeight):
            tensor = tensor.dequantize()
        if tuple(tensor.shape) != expected:
            raise ConfigError(f"shape {tuple(tensor.shape)}, expected {expected}")
        param.data.copy_(tensor)

    def process_weights_after_loading(self) -> None:
        """Keep a float32 CPU table whose values are all 16-bit ones in that type
        (:func:`cpu_half_weight`): a tied head reads it through :func:`dense_linear`, and a
        lookup widens its rows exactly."""
        half = cpu_half_weight(self.weight) if self.packed is None else None
        if half is not None:
            self.weight = nn.Parameter(half, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        packed = self.packed
        if packed is None:
            rows = F.embedding(ids, self.weight)
            return rows if rows.dtype == self._dtype else rows.to(self._dtype)
        rows = packed.rows(ids.to(packed.data.device)).to(device=ids.device, dtype=self._dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        kind = f"packed {self.packed.qtype}" if self.packed is not None else "dense"
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind}"


class QuantMethod(ABC):
    """How one linear layer stores its weight and computes ``x @ W.T + bias``.

    ``batch_invariant``: row ``i`` of :meth:`apply`'s output depends on ``x[i]`` alone, bit for
    bit, whatever the other rows and their number (a fixed reduction order per output, no
    split-K that depends on the shape). Under ``--enable-deterministic-inference`` a layer whose
    method does not say so multiplies its rows one at a time.

    ``serves_experts``: the routed experts of a MoE model quantized by this method can be served:
    each expert projection loads into a :class:`Linear` of this method, :meth:`expert_weight`
    gives its weight as the format computes with it (dense, in the model dtype: the runners read
    stacked dense experts) and :meth:`expert_activation` what the format does to the rows an
    expert multiplies (activation-quantized formats: a quantize-dequantize; emulated)."""

    serves_experts: bool = False

    def expert_weight(self, layer: "Linear") -> torch.Tensor:
        """A routed expert's projection loaded into ``layer`` (never processed): its weight as
        the format computes with it, dense, in the model dtype."""
        raise NotImplementedError(f"{type(self).__name__} does not serve routed experts")

    def expert_activation(self) -> ActQuant | None:
        """What the format does to the rows an expert multiplies (:data:`ActQuant`), or ``None``
        (nothing)."""
        return None

    #: the KV cache storage ``--kv-cache-dtype auto`` picks for a model served by this method
    #: (None: the model's dtype). A method whose arithmetic is already approximate may ask for
    #: 16-bit storage on the CPU, where the float32 model dtype would double the cache.
    kv_cache_dtype: torch.dtype | None = None

    batch_invariant: bool = False

    def for_layer(self, name: str) -> "QuantMethod | None":
        """The method for the layer called ``name`` (``model.layers.3.mlp.down_proj``,
        ``lm_head``...); ``None`` keeps that layer dense. Default: this method everywhere."""
        return self

    def group_codes(self, layer: "Linear", x: torch.Tensor) -> tuple[torch.dtype, int] | None:
        """(fp8 dtype, group) where :meth:`apply` takes ``x``'s rows as :class:`GroupCodes`
        (made by the kernel before the product: the codes and scales the method's own kernel
        would make from ``x``, bit for bit) instead of ``x``; ``None`` (default): it takes
        ``x``."""
        return None

    def native_kernel(self, layer: "Linear") -> NativeKernel | None:
        """A C function that computes this layer's product on the CPU (:class:`NativeKernel`),
        equal to :meth:`apply` on float32 input without a bias, for callers that run a whole
        forward in C (:class:`engine.runtime.fused_cpu.DecodePlan`); or ``None`` (default)
        where there is none."""
        return None

    @abstractmethod
    def create_weights(self, layer: "Linear", in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        """Register the layer's parameters/buffers (``layer.register_parameter``...).

        The loader fills parameters by name from the checkpoint, so names and shapes here are
        the checkpoint's (``weight`` [out_features, in_features] when unquantized).
        """

    def checkpoint_weights(self, weights: Iterator[Any]) -> Iterator[Any]:
        """The checkpoint's ``(name, tensor)`` stream as the model should load it (a format
        whose embeddings are quantized dequantizes them here). Default: unchanged."""
        return weights

    def process_weights_after_loading(self, layer: "Linear") -> None:
        """Repack loaded weights for :meth:`apply` (called once, after every weight is set)."""

    @abstractmethod
    def apply(self, layer: "Linear", x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        """``x`` [..., in_features] -> [..., out_features] in ``x.dtype``."""


class UnquantizedMethod(QuantMethod):
    """A dense ``weight`` [out, in] in the model dtype; ``F.linear``, or on CPU in float32 for
    a few rows the core's weight-streaming product (:func:`engine.runtime.fused_cpu.gemv`),
    which reads the weights at memory speed where a general matrix product does not."""

    def create_weights(self, layer: "Linear", in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        weight = torch.empty((out_features, in_features), dtype=dtype)
        layer.register_parameter("weight", nn.Parameter(weight, requires_grad=False))

    def apply(self, layer: "Linear", x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        return dense_linear(x, layer.weight, bias)

    def process_weights_after_loading(self, layer: "Linear") -> None:
        half = cpu_half_weight(layer.weight)
        if half is not None:
            layer.weight = nn.Parameter(half, requires_grad=False)

    def native_kernel(self, layer: "Linear") -> NativeKernel | None:
        return dense_native_kernel(layer.weight)


def cpu_half_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A float32 CPU weight that the weight-streaming product reads
    (:func:`~engine.runtime.fused_cpu.gemv_applies`) and whose every value is a bfloat16 (or
    else an IEEE half) value, in that 16-bit type: a half or bfloat16 checkpoint served in
    float32 keeps half the bytes, and every product is still the float32 one bit for bit (the
    kernel widens as it reads; more rows widen the weight for ``F.linear``). ``None`` where it
    stays float32 (``ENGINE_CPU_HALF_WEIGHTS=0``: always)."""
    from engine.runtime import fused_cpu

    if not fused_cpu.gemv_applies(torch.empty(1, weight.shape[-1]), weight):
        return None
    return exact_16bit(weight)


def exact_16bit(*tensors: torch.Tensor) -> list[torch.Tensor] | torch.Tensor | None:
    """Float32 CPU ``tensors`` in bfloat16, or else in half, when every value of every one of
    them is a value of that type (the conversion loses nothing) and the CPU kernels, which
    widen them as they read, are there; ``None`` otherwise (``ENGINE_CPU_HALF_WEIGHTS=0``:
    always). One tensor: that tensor, several: the list."""
    from engine.runtime import fused_cpu

    if not (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and os.environ.get("ENGINE_CPU_HALF_WEIGHTS") != "0" and fused_cpu.available()):
        return None
    for dtype in (torch.bfloat16, torch.float16):
        # (most float32 weights fail within their first 4096 values)
        if not all(torch.equal(t.reshape(-1)[:4096].to(dtype).float(), t.reshape(-1)[:4096])
                   for t in tensors):
            continue
        narrow = [t.to(dtype) for t in tensors]
        if all(torch.equal(n.float(), t) for n, t in zip(narrow, tensors)):
            return narrow[0] if len(narrow) == 1 else narrow
    return None


def dense_native_kernel(weight: torch.Tensor) -> NativeKernel | None:
    """The native kernel of :func:`dense_linear` on a CPU ``weight`` (float32, or kept in 16
    bits) for float32 rows: the weight-streaming product, for the rows :func:`dense_linear`
    gives it; ``None`` where :func:`dense_linear` would not use it."""
    from engine.runtime import fused_cpu

    if not (weight.device.type == "cpu" and fused_cpu.gemv_applies(
            torch.empty(1, weight.shape[-1]), weight)):
        return None
    return NativeKernel(fused_cpu.address("engine_cpu_dense_mm"),
                        fused_cpu.WEIGHT_TYPES[weight.dtype], weight.data_ptr(),
                        fused_cpu.GEMV_ROWS)


def dense_linear(x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``; on CPU in float32 for at most ``fused_cpu.GEMV_ROWS`` rows, the
    weight-streaming product (a float32 model's weight may be kept in 16 bits:
    :func:`cpu_half_weight`); on a GPU in half precision for at most
    ``gemv_triton.dense_rows(device)`` rows, the Triton matrix-vector kernel."""
    if x.device.type == "cpu":
        from engine.runtime import fused_cpu

        if fused_cpu.gemv_applies(x, weight):
            return fused_cpu.gemv(x, weight, bias)
        if weight.dtype != x.dtype and x.dtype == torch.float32:
            weight = weight.float()  # kept in 16 bits (cpu_half_weight): widened exactly
    elif x.is_cuda and weight.dtype in (torch.bfloat16, torch.float16):
        from engine.runtime import gemv_triton

        if (x.numel() <= gemv_triton.dense_rows(x.device) * x.shape[-1]
                and x.dtype == weight.dtype):
            y = gemv_triton.gemv(x.reshape(-1, x.shape[-1]), weight, bias=bias)
            return y.reshape(*x.shape[:-1], -1)
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    """``y = x W^T + b`` with storage and matmul delegated to ``quant_method``."""

    #: multiply one row at a time unless the method is batch-invariant (set by the model
    #: runner under ``--enable-deterministic-inference``)
    row_by_row: bool = False

    def __init__(self, in_features: int, out_features: int, *, bias: bool = False,
                 dtype: torch.dtype = torch.float32,
                 quant_method: QuantMethod | None = None,
                 shards: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        #: output widths of the checkpoint tensors fused into this layer (q/k/v, gate/up)
        self.shards = shards
        self.quant_method = quant_method or UnquantizedMethod()
        self.quant_method.create_weights(self, in_features, out_features, dtype)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    def group_codes(self, x: torch.Tensor) -> tuple[torch.dtype, int] | None:
        """The format in which this layer takes ``x``'s rows already quantized
        (:meth:`QuantMethod.group_codes`), where nothing between the caller and the method
        (a forward hook, row-by-row products) needs ``x`` itself; else ``None``."""
        if (self.row_by_row and not self.quant_method.batch_invariant) \
                or self._forward_hooks or self._forward_pre_hooks:
            return None
        return self.quant_method.group_codes(self, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.row_by_row and not self.quant_method.batch_invariant:
            return rowwise(lambda row: self.quant_method.apply(self, row, self.bias), x)
        return self.quant_method.apply(self, x, self.bias)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, "
                f"method={type(self.quant_method).__name__}")


def fused_gemv_weight(layer: "Linear", x: torch.Tensor) -> torch.Tensor | None:
    """``layer``'s weight when the Triton matrix-vector kernel may compute ``layer(f(x))`` with
    ``f`` (the residual add and norm, SiLU-and-mul before it) folded into its loads
    (:func:`engine.runtime.gemv_triton.gemv_norm` / ``gemv_silu``); else None. Opt-in with
    ``ENGINE_FUSED_GEMV=1``, for a dense half-precision layer with no forward hooks (LoRA),
    not multiplied row by row, and rows that the kernel serves
    (:func:`engine.runtime.gemv_triton.dense_rows`)."""
    if os.environ.get("ENGINE_FUSED_GEMV") != "1" or x.dim() != 2:
        return None
    from engine.runtime import fused

    if not fused.enabled(x) or not isinstance(layer.quant_method, UnquantizedMethod):
        return None
    if layer.row_by_row or layer._forward_hooks or layer._forward_pre_hooks:
        return None
    from engine.runtime import gemv_triton

    weight = layer.weight
    if weight.dtype != x.dtype or x.shape[0] > gemv_triton.dense_rows(x.device):
        return None
    return weight


def weight_tensors(layer: nn.Module) -> list[torch.Tensor]:
    """The tensors ``layer``'s product reads (its parameters and buffers, whatever its
    quantization method stored there)."""
    return [t for t in (*layer._parameters.values(), *layer._buffers.values()) if t is not None]


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn`` applied to each row of ``x`` [..., in] alone (a fresh [1, in] copy each time), the
    results stacked: every row goes through the very same call, whatever the batch."""
    flat = x.reshape(-1, x.shape[-1])
    rows = [fn(flat[i:i + 1].clone()) for i in range(flat.shape[0])]
    out = torch.cat(rows) if rows else fn(flat)
    return out.reshape(*x.shape[:-1], out.shape[-1])
