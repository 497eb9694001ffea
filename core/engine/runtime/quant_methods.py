"""The layer methods quantization plugins assemble: checkpoint parameters that load fused shards
by output rows, weight-only formats, fp8 (W8A16, W8A8 with dynamic per-token / per-group or
static activations, online) and int8 W8A8.

CPU paths are exact against the format's dequantize-then-float reference: weight-only and fp8
layers multiply a dense copy of the dequantized weight (as fast as the dense model; fp8
activations are quantized and dequantized the way the format's kernels see them), int8 W8A8
multiplies integers (``torch._int_mm``, exact) and scales the int32 sums. On a GPU the weights
stay packed (:func:`packed_kernels`): weight-only formats with an affine form, fp8 and int8 are
multiplied by the Triton kernels of :mod:`engine.runtime.quant_triton`, which read the packed
bytes (fp8 layers with row-wise scales go to ``torch._scaled_mm`` above ``KERNEL_ROWS`` rows).
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import os
import re
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ConfigError
from engine.runtime import quant_formats as qf
from engine.runtime.linear import (ActQuant, GroupCodes, Linear, NativeKernel, QuantMethod,
                                   UnquantizedMethod, dense_linear, dense_native_kernel)

#: row counts up to which fp8 layers with a cuBLAS path (row-wise scales) use the Triton product
#: (its swapped-operand kernel, up to ``quant_triton.SWAP_ROWS``; on an H200 the step's linear
#: layers at 17 / 32 / 64 rows took 0.71 / 0.69 / 0.77x of bf16 there against 1.17 / 1.10 /
#: 1.04x through ``torch._scaled_mm``, which is faster from 128 rows (0.93x),
#: docs/benchmarks/quantization.md; ``ENGINE_FP8_KERNEL_ROWS`` sets another, for A/B runs)
KERNEL_ROWS = int(os.environ.get("ENGINE_FP8_KERNEL_ROWS", "64"))
#: row counts above which int8 W8A8 layers served by the Triton kernels take cuBLAS's integer
#: product on a GPU instead (the rows' codes from ``quant_rows``, then ``torch._int_mm``);
#: ``ENGINE_INT8_KERNEL_ROWS`` sets it for A/B runs (default: the kernels at every row count)
INT8_KERNEL_ROWS = int(os.environ.get("ENGINE_INT8_KERNEL_ROWS", str(1 << 30)))
#: block fp8 (128 x 128 weight blocks, 1 x 128 activation groups) above this many rows goes to
#: ``torch._scaled_mm``'s block-scaled product on SM90+ where this torch has it (cuBLAS; on an
#: H200 the Llama-3-8B step's linear layers at 32 / 128 rows: 0.96x / 0.90x of bf16 against
#: 3.26x / 4.75x with ``w8_mm``, docs/benchmarks/quantization.md);
#: ``ENGINE_FP8_BLOCK_SCALED_MM=0`` keeps ``w8_mm`` for every row count
#: (``ENGINE_FP8_BLOCK_SCALED_ROWS`` sets another threshold, for A/B runs)
BLOCK_SCALED_ROWS = int(os.environ.get("ENGINE_FP8_BLOCK_SCALED_ROWS", "16"))


@functools.lru_cache(maxsize=None)
def block_scaled_mm_runs(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` takes the block-scaled form (1 x 128 activation groups,
    128 x 128 weight blocks) on this CUDA device: SM90 or later and a torch that accepts it,
    tried once on a 16 x 256 x 128 product laid out as :meth:`Fp8Method._block_scaled_apply`
    lays its operands out (outside any graph capture: weights are processed before)."""
    if torch.cuda.get_device_capability(device) < (9, 0):
        return False
    try:
        a = torch.zeros(16, 256, device=device).to(torch.float8_e4m3fn)
        w = torch.zeros(128, 256, device=device).to(torch.float8_e4m3fn)
        torch._scaled_mm(a, w.t(), scale_a=torch.ones(2, 16, device=device).t(),
                         scale_b=torch.ones(1, 2, device=device).t(), out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


#: fused projections and the checkpoint modules they are made of
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def checkpoint_names(name: str) -> list[str]:
    """The checkpoint module names a layer of the model is made of (a fused one: several)."""
    prefix, _, leaf = name.rpartition(".")
    parts = FUSED_PARTS.get(leaf)
    if parts is None:
        return [name]
    return [f"{prefix}.{p}" if prefix else p for p in parts]


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern or name.endswith("." + pattern) or pattern.endswith("." + name) \
        or ("." + pattern + ".") in ("." + name + ".")


def is_excluded(name: str, patterns: Sequence[str]) -> bool:
    """Whether the layer ``name`` is in a checkpoint's exclusion list (``ignore``,
    ``modules_to_not_convert``, ``exclude_modules``...: exact or dotted-suffix names, ``re:``
    regexes, shell wildcards). A fused layer must be excluded whole or not at all."""
    parts = checkpoint_names(name)
    hits = [any(_matches(p, pat) for pat in patterns) for p in parts]
    if any(hits) and not all(hits):
        raise ConfigError(f"{name}: the checkpoint quantizes only some of "
                          f"{', '.join(p.rpartition('.')[2] for p in parts)}; a fused layer "
                          "must be quantized whole")
    return all(hits)


# ---------------------------------------------------------------- sharded checkpoint params


def add_param(layer: Linear, name: str, shape: Sequence[int], dtype: torch.dtype,
              dim: int | None = 0, extent: Callable[[int], int] | None = None,
              device: torch.device | None = None) -> nn.Parameter:
    """Register a checkpoint tensor of ``layer`` whose ``weight_loader`` places each fused shard.

    ``dim``: the tensor's output-feature dimension (``None``: one tensor shared by every shard,
    such as a ``g_idx``); ``extent(n)``: how long a shard of ``n`` output features is along
    ``dim`` (packed codes: ``n // 8``; a per-tensor scale: ``1``). Shapes and dtype kinds are
    checked; a mismatch is a :class:`ConfigError` the loader prefixes with the tensor's name.
    ``device``: where the tensor lives (default: torch's current default device).
    """
    ext = extent or (lambda n: n)
    param = nn.Parameter(torch.zeros(tuple(shape), dtype=dtype, device=device),
                         requires_grad=False)

    def load(param: nn.Parameter, tensor: torch.Tensor, offset: int, size: int | None) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"expected a dense tensor, got {type(tensor).__name__}")
        if tensor.dtype == torch.uint32:
            tensor = tensor.view(torch.int32)
        dst = param.data
        if dim is not None and size is not None:
            shards = getattr(layer, "shards", None) or (layer.out_features,)
            starts = [sum(shards[:i]) for i in range(len(shards))]
            if offset not in starts:
                raise ConfigError(f"shard offset {offset} is not one of {starts}")
            i = starts.index(offset)
            dst = dst.narrow(dim, sum(ext(s) for s in shards[:i]), ext(shards[i]))
        if tuple(tensor.shape) != tuple(dst.shape):
            if tensor.numel() == dst.numel() and tensor.squeeze().shape == dst.squeeze().shape:
                tensor = tensor.reshape(dst.shape)
            else:
                raise ConfigError(f"has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)} "
                                  "for this quantization config")
        if tensor.dtype.is_floating_point != dst.dtype.is_floating_point:
            raise ConfigError(f"has dtype {str(tensor.dtype).replace('torch.', '')}, expected "
                              f"{str(dst.dtype).replace('torch.', '')}")
        dst.copy_(tensor)

    param.weight_loader = load
    layer.register_parameter(name, param)
    return param


def packed_extent(per: int, what: str) -> Callable[[int], int]:
    """Extent of ``per`` codes to a word along the output dimension (``what`` names the tensor
    for the error when a shard is not a whole number of words)."""
    def ext(n: int) -> int:
        if n % per:
            raise ConfigError(f"{what}: {n} output features are not a multiple of {per}")
        return n // per
    return ext


def check_group(prefix: str, in_features: int, group_size: int, field: str = "group_size"
                ) -> int:
    """The group size for ``in_features`` (-1: one group), or a ConfigError naming the field."""
    g = in_features if group_size in (-1, 0, None) else int(group_size)
    if in_features % g:
        raise ConfigError(f"{prefix}: quantization_config.{field} = {group_size} does not "
                          f"divide in_features {in_features}")
    return g


def fake_quant_fp8_rows(x: torch.Tensor, fp8: torch.dtype, scale: torch.Tensor | None = None,
                        group: int | None = None) -> torch.Tensor:
    """:func:`~engine.runtime.quant_formats.fake_quant_fp8` in ``x``'s dtype; float32 rows on
    the CPU in one C call (bit-identical to the torch ops)."""
    if x.device.type == "cpu" and x.dtype is torch.float32:
        from engine.runtime import fused_cpu

        fq = fused_cpu.fake_quant_fp8(x.contiguous(), fp8, scale=scale, group=group)
        if fq is not None:
            return fq
    return qf.fake_quant_fp8(x, fp8, scale=scale, group=group).to(x.dtype)


def fake_quant_nvfp4_rows(x: torch.Tensor) -> torch.Tensor:
    """NVFP4 activations (a global scale per row: :func:`~engine.runtime.quant_formats.
    fake_quant_nvfp4`) in ``x``'s dtype; float32 rows on the CPU in one C call
    (bit-identical)."""
    if x.device.type == "cpu" and x.dtype is torch.float32:
        from engine.runtime import fused_cpu

        fq = fused_cpu.fake_quant_nvfp4_rows(x.contiguous())
        if fq is not None:
            return fq
    return qf.fake_quant_nvfp4(x, per_row=True).to(x.dtype)


class ExpertInputScales:
    """Static input scales of routed experts, reduced as MoE kernels reduce them: per layer,
    the largest of its experts' gate/up projections' scales and the largest of their down
    projections'. :meth:`record` is called as each expert projection loads; the roundings
    :meth:`act_quant` returns read the maxima when they run (after loading)."""

    def __init__(self) -> None:
        self.maxima: dict[tuple[str, bool], float] = {}

    @staticmethod
    def _key(name: str, down: bool) -> tuple[str, bool]:
        return name.partition(".experts")[0], down

    def record(self, projection: str, scale: torch.Tensor) -> None:
        """``scale`` of the expert projection ``projection`` (``...experts.3.down_proj``)."""
        key = self._key(projection, projection.endswith(("down_proj", ".w2")))
        self.maxima[key] = max(self.maxima.get(key, 0.0), float(scale.max()))

    def act_quant(self, experts: str,
                  rounding: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> ActQuant:
        """The (gate/up rows, down rows) roundings of the layer of ``experts`` (a name under
        it): ``rounding(x, scale)`` with that input's largest scale."""
        def rows(down: bool) -> Callable[[torch.Tensor], torch.Tensor]:
            key = self._key(experts, down)

            def act(x: torch.Tensor) -> torch.Tensor:
                scale = torch.tensor([[self.maxima[key]]], dtype=torch.float32, device=x.device)
                return rounding(x, scale).to(x.dtype)
            return act
        return rows(False), rows(True)


def drop_checkpoint_params(layer: Linear) -> None:
    """Remove the checkpoint tensors a method registered on ``layer`` (the bias stays), once
    it has kept what its product reads."""
    for name in [n for n, _ in layer.named_parameters(recurse=False) if n != "bias"]:
        delattr(layer, name)


def int_product(xq: torch.Tensor, wq_t: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] @ int8 [K, N] -> exact int32 sums (``torch._int_mm``; cuBLAS's int8 GEMMs
    want more than 16 rows, so a CUDA decode batch is padded to 17)."""
    m = xq.shape[0]
    if xq.is_cuda and m <= 16:
        xq = F.pad(xq, (0, 0, 0, 17 - m))
    return torch._int_mm(xq, wq_t)[:m]


class LayerMethod(QuantMethod):
    """A method bound to one layer name (``prefix``) by :meth:`bind`, for error messages."""

    prefix: str = ""

    def bind(self, name: str) -> "LayerMethod":
        bound = copy.copy(self)
        bound.prefix = name
        return bound


# ---------------------------------------------------------------- weight-only, dequantized


def packed_kernels(layer: Linear) -> bool:
    """Whether ``layer`` keeps its quantized weight packed and multiplies it with the Triton
    kernels of :mod:`engine.runtime.quant_triton`: a half-precision model on a GPU (or under
    the Triton interpreter, for tests), unless ``ENGINE_DISABLE_QUANT_KERNELS=1``."""
    from engine.runtime import fused

    if os.environ.get("ENGINE_DISABLE_QUANT_KERNELS") == "1":
        return False
    device = next((p.device for p in layer.parameters()), torch.device("cpu"))
    return fused.triton_serves(device, getattr(layer, "quant_dtype", None))


def pack_weight_only(device: torch.device, bits: int | None = None) -> bool:
    """Whether a weight-only layer on ``device`` keeps its ``bits``-bit codes packed rather than
    a dense copy in the model dtype: ``ENGINE_PACKED_WEIGHT_ONLY=1`` always, ``=0`` never; by
    default on a CUDA device when :data:`engine.runtime.quant_triton.PACKED_BITS` lists the
    width (the packed products measured at least as fast as the dense copy's at every row
    count; a quarter of the memory). ``bits`` None: whether any width may be kept, asked before
    the codes are repacked."""
    from engine.runtime import quant_triton

    choice = os.environ.get("ENGINE_PACKED_WEIGHT_ONLY")
    if choice in ("0", "1"):
        return choice == "1"
    if device.type != "cuda":
        return False
    return bool(quant_triton.PACKED_BITS) if bits is None else bits in quant_triton.PACKED_BITS


def _exact16(v: torch.Tensor) -> torch.Tensor | None:
    """``v`` in the first of float16, bfloat16 that holds each of its values exactly."""
    for dtype in (torch.float16, torch.bfloat16):
        h = v.to(dtype)
        if torch.equal(h.to(v.dtype), v):
            return h
    return None


def compact_constants(scale: torch.Tensor, bias: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed weight's float32 scales and biases [groups, N] -> the compact form the affine
    kernels also read (:func:`engine.runtime.quant_triton._affine_constants`): the scale
    ``s`` in a 16-bit float and, in place of the bias ``b``, the ratio ``b / s`` in one, where
    both hold exactly and ``s (b / s)`` is ``b`` with no rounding (checked in float64, so the
    kernels' float32 product is ``b`` too). Integer formats store ``b = -z s`` with a small
    integer ``z`` and 16-bit scales (GPTQ, AWQ, compressed-tensors): a half of the bytes the
    constants take (an eighth of 4-bit codes' in groups of 128), the same weights. Else (MLX's
    free biases, scales computed in float32) the float32 pair as given;
    ``ENGINE_AFFINE_COMPACT=0`` keeps float32 always."""
    if os.environ.get("ENGINE_AFFINE_COMPACT") == "0" or scale.dtype != torch.float32:
        return scale, bias
    s16 = _exact16(scale)
    if s16 is None:
        return scale, bias
    ratio = _exact16(torch.where(scale == 0, 0.0, bias / scale))
    if ratio is None or not torch.equal(s16.double() * ratio.double(), bias.double()):
        return scale, bias
    return s16, ratio


class AffineWeight:
    """A weight-only integer weight in the canonical form of
    :func:`engine.runtime.quant_triton.affine_mm`: ``W[n, k] = codes[n, k] * scale[n, k // group]
    + bias[n, k // group]`` with unsigned ``bits``-bit codes, columns taken in the order
    ``perm`` (act-order checkpoints: groups made contiguous) when given; scales stored
    [groups, N]. It holds the codes [N, K] as given until :meth:`pack` packs them for the
    kernel (:attr:`q`); the other forms (:class:`Int4PackWeight`, :class:`CpuAffineWeight`)
    are made from the codes, never packed."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, bits: int,
                 group: int, perm: torch.Tensor | None = None) -> None:
        from engine.runtime import quant_triton

        self.sub = quant_triton.affine_sub(group)
        self.codes: torch.Tensor | None = codes
        self.scale = scale.to(torch.float32).t().contiguous()
        self.bias = bias.to(torch.float32).t().contiguous()
        self.bits, self.group, (self.n, self.k) = bits, group, codes.shape
        self.perm = perm.to(torch.int32).contiguous() if perm is not None else None

    @functools.cached_property
    def q(self) -> torch.Tensor:
        """The codes packed for the kernel (:func:`~engine.runtime.quant_triton.pack_affine`)."""
        from engine.runtime import quant_triton

        return quant_triton.pack_affine(self.codes, self.bits, self.sub)

    def pack(self) -> "AffineWeight":
        """This weight as the GPU kernels keep it: the codes packed, the unpacked ones let go,
        the scales and biases in the compact form where it is exact
        (:func:`compact_constants`)."""
        self.q  # noqa: B018 (computed and cached)
        self.codes = None
        self.scale, self.bias = compact_constants(self.scale, self.bias)
        return self

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from engine.runtime import quant_triton

        shape = x.shape
        y = quant_triton.affine_mm(x.reshape(-1, shape[-1]), self.q, self.scale, self.bias,
                                   self.bits, self.group, self.sub, perm=self.perm, bias=bias)
        return y.reshape(*shape[:-1], -1)


class AffineShards:
    """Fused shards whose columns are permuted differently (act-order shards quantized
    apart): one :class:`AffineWeight` (or :class:`Int4PackWeight`) each, their outputs side
    by side."""

    def __init__(self, parts: list[AffineWeight | Int4PackWeight]) -> None:
        self.parts = parts
        self.widths = [p.n for p in parts]
        self.bits = parts[0].bits

    def pack(self) -> "AffineShards":
        """Each shard as :meth:`AffineWeight.pack` keeps it."""
        for p in self.parts:
            p.pack()
        return self

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        biases = bias.split(self.widths) if bias is not None else [None] * len(self.parts)
        return torch.cat([p.matmul(x, b) for p, b in zip(self.parts, biases)], -1)


class Int4PackWeight:
    """A 4-bit :class:`AffineWeight` in PyTorch's own tiled int4 layout, multiplied by
    ``torch._weight_int4pack_mm`` (the CUDA kernel of torchao's int4 weight-only path; on the
    CPU its ``_for_cpu`` twin, for tests). That kernel computes ``W = (q - 8) * scale + zero``
    from bfloat16 (scale, zero) pairs [K / group, N, 2], so the canonical ``q * s + b`` maps
    onto it as ``zero = b + 8 s``: exact for symmetric codes (``b = -8 s``), otherwise ``zero``
    rounded to bfloat16 (at most 2^-9 of ``|b + 8 s|`` per weight). Scales round to bfloat16
    too (GPTQ and AWQ store them in float16: 2^-9 relative at most)."""

    bits = 4

    def __init__(self, aw: AffineWeight, tiles: int) -> None:
        codes = aw.codes.to(torch.int32).contiguous()  # [N, K] (a checkpoint's may be a view)
        if codes.is_cuda:
            pairs = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8).contiguous()
            self.w = torch._convert_weight_to_int4pack(pairs, tiles)
        else:
            self.w = torch._convert_weight_to_int4pack_for_cpu(codes, tiles)
        self.sz = torch.stack([aw.scale, aw.bias + 8 * aw.scale], 2).to(torch.bfloat16) \
            .contiguous()  # [K / group, N, 2]
        self.group, self.perm, self.n = aw.group, aw.perm, codes.shape[0]

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        if self.perm is not None:
            x = x.index_select(1, self.perm)
        x = x.contiguous()
        mm = torch._weight_int4pack_mm if x.is_cuda else torch._weight_int4pack_mm_for_cpu
        y = mm(x, self.w, self.group, self.sz)
        if bias is not None:
            y = y + bias
        return y.reshape(*shape[:-1], self.n)


#: inner K tiles of :class:`Int4PackWeight`'s layout (``torch._convert_weight_to_int4pack``
#: takes 2, 4 or 8; K must be a multiple of 16 times it)
INT4PACK_TILES = 8


def int4pack_form(packed: AffineWeight | AffineShards, dtype: torch.dtype
                  ) -> Int4PackWeight | AffineShards | None:
    """``packed`` (not yet :meth:`~AffineWeight.pack`-ed) as an :class:`Int4PackWeight` (each
    shard of an :class:`AffineShards`) where ``ENGINE_W4_INT4PACK=1`` asks for PyTorch's int4
    kernel and it serves the weight: 4-bit codes in groups of 32, 64, 128 or 256, bfloat16
    activations, N a multiple of 8 and K of 16 x :data:`INT4PACK_TILES`; otherwise ``None``.
    Off by default: the Triton kernels of :func:`engine.runtime.quant_triton.affine_mm`
    serve."""
    if os.environ.get("ENGINE_W4_INT4PACK") != "1" or dtype != torch.bfloat16:
        return None
    parts = packed.parts if isinstance(packed, AffineShards) else [packed]
    if not all(p.bits == 4 and p.group in (32, 64, 128, 256) and p.n % 8 == 0
               and p.k % (16 * INT4PACK_TILES) == 0 and p.k % p.group == 0 for p in parts):
        return None
    forms = [Int4PackWeight(p, INT4PACK_TILES) for p in parts]
    return AffineShards(forms) if isinstance(packed, AffineShards) else forms[0]


#: rows up to which a float32 CPU layer with 4- or 8-bit affine codes multiplies them packed
#: (:class:`CpuAffineWeight`), and up to which a layer of at least :data:`CPU_AFFINE_LARGE`
#: weights does; more rows take the layer's dense copy. This machine class (2 cores, weights
#: read cold as in a decode step; ``benchmarks/affine_cpu.py``, docs/benchmarks/quantization.md):
#: the packed product 0.28-0.52x of the dense one at 1 row, 0.40-0.80x at 4; at 8 rows
#: 0.56-0.88x for the layers of 4M weights and more, 0.77-1.00x for those below 2M
CPU_AFFINE_ROWS, CPU_AFFINE_ROWS_LARGE, CPU_AFFINE_LARGE = 4, 8, 1 << 21


def cpu_affine_rows(weights: int) -> int:
    """Rows up to which a CPU layer of ``weights`` 4- or 8-bit weights multiplies its codes."""
    return CPU_AFFINE_ROWS_LARGE if weights >= CPU_AFFINE_LARGE else CPU_AFFINE_ROWS


class CpuAffineWeight:
    """A 4- or 8-bit :class:`AffineWeight` for the CPU's packed product
    (:func:`engine.runtime.fused_cpu.affine`): 8-bit codes as bytes, 4-bit ones as nibbles in
    32-column blocks, float32 scales and biases [N, K / group]. Exact weights in float32, the
    dequantized weight's product up to the order of additions, reading a quarter (8-bit) or an
    eighth (4-bit) of the dense float32 bytes."""

    def __init__(self, aw: AffineWeight) -> None:
        codes = aw.codes.to(torch.uint8)
        if aw.bits == 4:
            c = codes.reshape(aw.n, aw.k // 32, 2, 16)
            codes = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(aw.n, aw.k // 2)
        self.codes = codes.contiguous()
        self.scale, self.bias = aw.scale.t().contiguous(), aw.bias.t().contiguous()
        self.bits, self.group, self.perm, self.n = aw.bits, aw.group, aw.perm, aw.n

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from engine.runtime import fused_cpu

        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        return fused_cpu.affine(x, self.codes, self.bits, self.scale, self.bias, self.group,
                                bias)


def cpu_affine_serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weight-only layers of a ``dtype`` model on ``device`` may keep a packed CPU form
    (:func:`cpu_affine_form`): a float32 model on the CPU with the C kernels available, unless
    ``ENGINE_CPU_PACKED_AFFINE=0``."""
    from engine.runtime import fused_cpu

    return (device.type == "cpu" and dtype == torch.float32
            and os.environ.get("ENGINE_CPU_PACKED_AFFINE") != "0" and fused_cpu.available())


def cpu_affine_form(packed: AffineWeight | AffineShards | None
                    ) -> CpuAffineWeight | AffineShards | None:
    """The packed CPU form of a weight-only layer's affine weight (not yet
    :meth:`~AffineWeight.pack`-ed; each shard of an :class:`AffineShards`), for a model
    :func:`cpu_affine_serves` serves: 4- or 8-bit codes in groups of a multiple of 32 columns;
    ``None`` otherwise."""
    if packed is None:
        return None
    parts = packed.parts if isinstance(packed, AffineShards) else [packed]
    if not all(p.bits in (4, 8) and p.group % 32 == 0 and p.k % p.group == 0 for p in parts):
        return None
    forms = [CpuAffineWeight(p) for p in parts]
    return AffineShards(forms) if isinstance(packed, AffineShards) else forms[0]


def act_order(g_idx: torch.Tensor, group: int) -> tuple[bool, torch.Tensor | None]:
    """(servable, permutation) for a per-column group index: ``(True, None)`` when the groups
    are the plain ``k // group``; ``(True, perm)`` when sorting the columns by group makes every
    group ``group`` contiguous columns (GPTQ's act-order); ``(False, None)`` otherwise."""
    k = g_idx.numel()
    g = g_idx.long().reshape(-1)
    plain = torch.arange(k, device=g.device) // group
    if torch.equal(g, plain):
        return True, None
    perm = torch.sort(g, stable=True).indices
    return bool(torch.equal(g[perm], plain)), perm


class DequantizedMethod(LayerMethod):
    """A weight-only format: ``create_weights`` registers the checkpoint's tensors
    (:func:`add_param`), :meth:`dequantize` turns them into float32 [out, in].

    On the CPU (and for formats with no :meth:`affine` form) the tensors are replaced after
    loading by a dense ``weight`` in the model dtype and the product is the dense model's
    (:func:`~engine.runtime.linear.dense_linear`: exact against the float reference, and as
    fast as the dense model). A float32 CPU model whose format has a 4- or 8-bit :meth:`affine`
    form also keeps its codes packed (:func:`cpu_affine_form`) and multiplies a few rows
    (decode: :func:`cpu_affine_rows`) with them, reading an eighth or a quarter of the dense
    bytes; more rows (prefill) take the dense copy. On a GPU (:func:`packed_kernels`) a format
    with an :meth:`affine` form keeps its codes packed where :func:`pack_weight_only` says so
    and multiplies them in a Triton kernel that dequantizes as it reads, so a decode step
    reads the packed bytes only."""

    serves_experts = True

    def dequantize(self, layer: Linear) -> torch.Tensor:
        raise NotImplementedError

    def affine(self, layer: Linear) -> AffineWeight | AffineShards | None:
        """The weight as an :class:`AffineWeight` (``None``: this format or this layer's
        configuration has none; it is served dense)."""
        return None

    def dense_weight(self, layer: Linear) -> torch.Tensor:
        """The loaded weight, dequantized, in the model dtype."""
        return self.dequantize(layer).to(layer.quant_dtype)

    def expert_weight(self, layer: Linear) -> torch.Tensor:
        return self.dense_weight(layer)

    def process_weights_after_loading(self, layer: Linear) -> None:
        packed, cpu, group = None, None, getattr(layer, "group", None)
        device = next((p.device for p in layer.parameters()), torch.device("cpu"))
        if group and packed_kernels(layer) and pack_weight_only(device):
            from engine.runtime import quant_triton  # (Triton only where its kernels run)

            packed = self.affine(layer) if quant_triton.affine_sub(group) else None
            if packed is not None and not pack_weight_only(device, packed.bits):
                packed = None
            if packed is not None:
                packed = int4pack_form(packed, layer.quant_dtype) or packed.pack()
        elif group and group % 32 == 0 and cpu_affine_serves(device, layer.quant_dtype):
            # the CPU keeps the dense copy too: many rows (prefill) multiply it faster
            cpu = cpu_affine_form(self.affine(layer))
        w = self.dense_weight(layer) if packed is None else None
        drop_checkpoint_params(layer)
        layer.packed, layer.cpu_packed = packed, cpu
        if w is not None:
            layer.weight = nn.Parameter(w, requires_grad=False)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if layer.packed is not None:
            return layer.packed.matmul(x, bias)
        cpu = getattr(layer, "cpu_packed", None)
        if cpu is not None and x.dtype == torch.float32 and x.numel() <= x.shape[-1] * \
                cpu_affine_rows(layer.in_features * layer.out_features):
            return cpu.matmul(x, bias)
        return dense_linear(x, layer.weight, bias)

    def native_kernel(self, layer: Linear) -> NativeKernel | None:
        if layer.packed is not None:
            return None
        dense = dense_native_kernel(layer.weight)
        cpu = getattr(layer, "cpu_packed", None)
        return dense if cpu is None else cpu_affine_native(layer, cpu, dense)


def cpu_affine_native(layer: Linear, form: CpuAffineWeight | AffineShards,
                      dense: NativeKernel | None) -> NativeKernel:
    """The native kernel of a layer's packed CPU form (``engine_cpu_affine_mm`` in
    fused_cpu.c): its codes for the rows :meth:`DequantizedMethod.apply` multiplies them with,
    the dense copy's kernel (``dense``) beyond; its descriptor stays alive with the layer."""
    from engine.runtime import fused_cpu

    rows = cpu_affine_rows(layer.in_features * layer.out_features)
    if dense is not None and dense.type != fused_cpu.WEIGHT_TYPES[torch.float32]:
        dense = None  # (the descriptor's dense copy is float32)
    parts = form.parts if isinstance(form, AffineShards) else [form]
    perms = [p.perm.to("cpu", torch.int64).contiguous() if p.perm is not None else None
             for p in parts]
    desc = [len(parts), rows, dense.weight if dense is not None else 0]
    for p, perm in zip(parts, perms):
        desc += [p.n, p.codes.data_ptr(), p.bits, p.scale.data_ptr(), p.bias.data_ptr(),
                 p.group, perm.data_ptr() if perm is not None else 0]
    layer.cpu_native = (torch.tensor(desc, dtype=torch.int64), perms)
    return NativeKernel(fused_cpu.address("engine_cpu_affine_mm"), 0,
                        layer.cpu_native[0].data_ptr(), dense.rows if dense is not None else rows)


# ---------------------------------------------------------------- fp8


class Fp8Method(LayerMethod):
    """fp8 weights with per-tensor (one scale per fused shard), per-channel or block scales;
    activations quantized dynamically per token (``act="dynamic"``, ``act_group`` columns per
    scale for block formats), statically per tensor (``"static"``: ``input_scale``, the largest
    of a fused layer's shards), or not at all (``None``: W8A16). ``online``: the checkpoint is
    dense and the weight is quantized per output channel at load."""

    def __init__(self, *, weight_scheme: str = "channel", act: str | None = "dynamic",
                 block: tuple[int, int] | None = None, act_group: int | None = None,
                 scale_name: str = "weight_scale", dtype: torch.dtype = torch.float8_e4m3fn,
                 online: bool = False) -> None:
        if weight_scheme == "block" and block is None:
            raise ConfigError("block fp8 needs its block size (weight_block_size)")
        self.weight_scheme, self.act, self.block, self.act_group = weight_scheme, act, block, \
            act_group
        self.scale_name, self.fp8, self.online = scale_name, dtype, online
        self.expert_scales = ExpertInputScales()

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        if self.online:
            UnquantizedMethod().create_weights(layer, in_features, out_features, dtype)
            return
        add_param(layer, "weight", (out_features, in_features), self.fp8)
        n_shards = len(getattr(layer, "shards", None) or (1,))
        if self.weight_scheme == "tensor":
            add_param(layer, self.scale_name, (n_shards,), torch.float32, extent=lambda n: 1)
        elif self.weight_scheme == "channel":
            add_param(layer, self.scale_name, (out_features, 1), torch.float32)
        else:
            bn, bk = self.block
            rows = lambda n: -(-n // bn)  # noqa: E731
            shards = getattr(layer, "shards", None) or (out_features,)
            add_param(layer, self.scale_name, (sum(rows(s) for s in shards), -(-in_features // bk)),
                      torch.float32, extent=rows)
        if self.act == "static":
            add_param(layer, "input_scale", (n_shards,), torch.float32, extent=lambda n: 1)

    def _channel_scales(self, layer: Linear) -> torch.Tensor:
        """float32 [N, 1] per-output-channel scales (per-tensor scales expanded per shard)."""
        s = getattr(layer, self.scale_name).data.to(torch.float32)
        if self.weight_scheme == "channel":
            return s.reshape(-1, 1)
        shards = getattr(layer, "shards", None) or (layer.out_features,)
        return torch.repeat_interleave(s, torch.tensor(shards, device=s.device)).reshape(-1, 1)

    def _dequantize(self, layer: Linear) -> torch.Tensor:
        w = layer.weight.data.to(torch.float32)
        if self.weight_scheme != "block":
            return w * self._channel_scales(layer)
        bn, bk = self.block
        s = getattr(layer, self.scale_name).data
        shards = getattr(layer, "shards", None) or (layer.out_features,)
        out, row, srow = [], 0, 0
        for n in shards:
            nb = -(-n // bn)
            out.append(w[row:row + n] * qf.expand_blocks(s[srow:srow + nb], n, w.shape[1],
                                                         self.block))
            row, srow = row + n, srow + nb
        return torch.cat(out)

    serves_experts = True

    def _quantize_online(self, layer: Linear) -> None:
        """A dense checkpoint's weight, quantized per output channel into the fp8 parameters."""
        w = layer.weight.data.to(torch.float32)
        scale = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / qf.FP8_MAX[self.fp8]
        del layer.weight
        add_param(layer, "weight", tuple(w.shape), self.fp8, device=w.device).data.copy_(
            qf.quantize_fp8(w, scale, self.fp8))
        add_param(layer, self.scale_name, tuple(scale.shape), torch.float32,
                  device=w.device).data.copy_(scale)

    def expert_weight(self, layer: Linear) -> torch.Tensor:
        if self.online:
            self._quantize_online(layer)
        if self.act == "static":
            self.expert_scales.record(self.prefix, layer.input_scale.data)
        return self._dequantize(layer).to(layer.quant_dtype)

    def expert_activation(self) -> ActQuant | None:
        if self.act is None:
            return None
        fp8, group = self.fp8, self.act_group
        if self.act == "static":
            return self.expert_scales.act_quant(
                self.prefix, lambda x, s: fake_quant_fp8_rows(x, fp8, scale=s))

        def rows(x: torch.Tensor) -> torch.Tensor:
            return fake_quant_fp8_rows(x, fp8, group=group)
        return rows, rows

    def process_weights_after_loading(self, layer: Linear) -> None:
        dtype = layer.quant_dtype
        if self.online:
            self._quantize_online(layer)
        layer.act_scale = (layer.input_scale.data.max().reshape(1, 1).float()
                           if self.act == "static" else None)
        layer.kernel = packed_kernels(layer) and self._kernel_serves(layer)
        layer.cuda_rowwise = (layer.weight.is_cuda and self.act is not None
                              and self.weight_scheme != "block" and self.act_group is None)
        layer.block_scaled = layer.kernel and self._block_scaled_serves(layer)
        if layer.kernel or layer.cuda_rowwise:
            layer.w_scale = (getattr(layer, self.scale_name).data.to(torch.float32).contiguous()
                             if self.weight_scheme == "block"
                             else self._channel_scales(layer).reshape(-1).contiguous())
            layer.w_q = layer.weight.data
            layer.w_t = layer.weight.data.t()
            return
        w = self._dequantize(layer)
        drop_checkpoint_params(layer)
        layer.weight = nn.Parameter(w.to(dtype), requires_grad=False)

    def _kernel_serves(self, layer: Linear) -> bool:
        """Whether :func:`~engine.runtime.quant_triton.w8_mm` computes this layer: block scales
        must not straddle fused shards, and activations grouped per block (or not at all)."""
        if self.weight_scheme != "block":
            return self.act_group is None
        bn, bk = self.block
        shards = getattr(layer, "shards", None) or (layer.out_features,)
        return all(n % bn == 0 for n in shards) and self.act_group in (None, bk)

    def _block_scaled_serves(self, layer: Linear) -> bool:
        """Whether ``torch._scaled_mm``'s block-scaled product takes this layer above
        :data:`BLOCK_SCALED_ROWS` rows: 128 x 128 e4m3 blocks with 1 x 128 activation groups,
        on a CUDA device of SM90 or later."""
        w = layer.weight
        return (os.environ.get("ENGINE_FP8_BLOCK_SCALED_MM", "1") != "0" and w.is_cuda
                and self.weight_scheme == "block" and self.block == (128, 128)
                and self.act_group == 128 and self.fp8 == torch.float8_e4m3fn
                and layer.in_features % 128 == 0 and block_scaled_mm_runs(w.device))

    def _block_scaled_apply(self, layer: Linear, x2: torch.Tensor,
                            bias: torch.Tensor | None) -> torch.Tensor:
        """``torch._scaled_mm`` over the activations' codes per 1 x 128 group (the format's
        quantizer in one kernel, :func:`~engine.runtime.quant_triton.quant_groups`; rows padded
        to 16 with zeros) and the weight's 128 x 128 block scales."""
        from engine.runtime import quant_triton as qt

        m = x2.shape[0]
        pad = -m % 16
        xq, xs = qt.quant_groups(F.pad(x2, (0, 0, 0, pad)) if pad else x2, self.fp8, 128)
        y = torch._scaled_mm(xq, layer.w_t, scale_a=xs, scale_b=layer.w_scale.t(),
                             out_dtype=x2.dtype)[:m]
        return y if bias is None else y + bias

    def _rows_quantized(self, layer: Linear,
                        x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The activations' fp8 codes [M, K] and float32 scales [M, 1] (per token, or the
        static scale): in one Triton kernel where the layer's kernels run (the torch ops' codes
        exactly: ``quant_triton.quant_rows``), else by the torch ops."""
        static = layer.act_scale
        if layer.kernel:
            from engine.runtime import quant_triton as qt

            xq, xs = qt.quant_rows(x2, self.fp8,
                                   static=static.reshape(1) if static is not None else None)
            return xq, xs.reshape(-1, 1)
        scale = (static.expand(x2.shape[0], 1).contiguous() if static is not None
                 else qf.fp8_scale_per_token(x2, self.fp8))
        return qf.quantize_fp8(x2, scale, self.fp8), scale

    def _kernel_apply(self, layer: Linear, x2: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
        from engine.runtime import quant_triton as qt

        block = self.block if self.weight_scheme == "block" else None
        act = (None if self.act is None else "group" if self.act_group is not None
               else "static" if layer.act_scale is not None else "token")
        static = layer.act_scale.reshape(1) if layer.act_scale is not None else None
        return qt.w8_mm(x2, layer.w_q, layer.w_scale, act=act, x_scale=static, block=block,
                        bias=bias)

    def group_codes(self, layer: Linear, x: torch.Tensor) -> tuple[torch.dtype, int] | None:
        """Block fp8 with activations per group of a scale block's columns, a few rows on the
        Triton kernel that reads group codes (``swap_triton.takes_group_codes``), where the
        kernels before may write them (``swap_triton.producer_codes``)."""
        if not (getattr(layer, "kernel", False) and self.weight_scheme == "block"
                and self.act == "dynamic" and self.act_group == self.block[1]
                and x.dim() == 2  # (the rows apply would hand to the Triton kernels)
                and not (layer.block_scaled and x.shape[0] > BLOCK_SCALED_ROWS)):
            return None
        from engine.runtime import swap_triton

        if not (swap_triton.producer_codes()
                and swap_triton.takes_group_codes(layer.w_q, self.block, x.shape[0])):
            return None
        return self.fp8, self.act_group

    def _codes_apply(self, layer: Linear, x: GroupCodes,
                     bias: torch.Tensor | None) -> torch.Tensor:
        """The product from codes the kernel before made (:meth:`group_codes`)."""
        from engine.runtime import swap_triton

        if x.group != self.act_group or x.codes.dtype != self.fp8:
            raise ValueError(f"group codes of {x.codes.dtype} in groups of {x.group} for a "
                             f"layer of {self.fp8} in groups of {self.act_group}")
        w = layer.w_q
        launch = swap_triton.small_config(w.dtype, "group", self.block, *w.shape,
                                          x.codes.shape[0])  # (w8_mm's launch for x's rows)
        return swap_triton.w8_swap(x.codes, w, layer.w_scale, act="group_codes",
                                   x_scale=x.scales, block=self.block, out_dtype=x.dtype,
                                   bias=bias, config=launch)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if isinstance(x, GroupCodes):
            return self._codes_apply(layer, x, bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if layer.block_scaled and x2.shape[0] > BLOCK_SCALED_ROWS:
            return self._block_scaled_apply(layer, x2, bias).reshape(*shape[:-1], -1)
        if layer.kernel and (x2.shape[0] <= KERNEL_ROWS or not layer.cuda_rowwise):
            return self._kernel_apply(layer, x2, bias).reshape(*shape[:-1], -1)
        if layer.cuda_rowwise:
            xq, scale = self._rows_quantized(layer, x2)
            y = torch._scaled_mm(xq, layer.w_t, scale_a=scale,
                                 scale_b=layer.w_scale.reshape(1, -1), bias=bias,
                                 out_dtype=x.dtype)
            return y.reshape(*shape[:-1], -1)
        if self.act is not None:
            if x2.device.type == "cpu" and x2.dtype is torch.float32:
                from engine.runtime import fused_cpu  # one C call, bit-identical to the ops

                x2 = x2.contiguous()
                y = fused_cpu.fp8_linear(x2, layer.weight, bias, self.fp8, layer.act_scale,
                                         self.act_group)  # a few rows: quantize and product
                if y is not None:
                    return y.reshape(*shape[:-1], -1)
            x2 = fake_quant_fp8_rows(x2, self.fp8, scale=layer.act_scale, group=self.act_group)
        return dense_linear(x2, layer.weight, bias).reshape(*shape[:-1], -1)


#: MX element format -> (checkpoint weight dtype, codes per stored element, quantizer,
#: dequantizer): the quantizer maps float32 [M, K] to (codes, UE8M0 exponents [M, K/32])
MX_FORMATS = {"mxfp8": (torch.float8_e4m3fn, 1, qf.quantize_mxfp8, qf.dequant_mxfp8),
              "mxfp4": (torch.uint8, 2, qf.quantize_mxfp4, qf.dequant_mxfp4)}


class MXMethod(LayerMethod):
    """The OCP MX formats: ``weight`` codes of the element format ``fmt`` with a UE8M0
    (power-of-two) ``weight_scale`` per 1x32 block; activations quantized dynamically per token
    and 32 columns (``act``: the weights' format by default, ``"mxfp8"``/``"mxfp4"``, or
    ``None``: not at all). Emulated on every device here (MX tensor cores start at SM100): the
    weight is dequantized once at load, each activation quantized and dequantized, then a dense
    product, which is exact against the format's dequantize-then-float reference. ``online``: a
    dense checkpoint's weights are quantized at load."""

    fmt = "mxfp8"

    def __init__(self, *, online: bool = False, act: str | None = "") -> None:
        self.online = online
        self.act = self.fmt if act == "" else act
        if self.act is not None and self.act not in MX_FORMATS:
            raise ValueError(f"MX activations are {', '.join(MX_FORMATS)} or None, not "
                             f"{self.act!r}")

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        check_group(self.prefix, in_features, qf.MX_BLOCK)
        if self.online:
            UnquantizedMethod().create_weights(layer, in_features, out_features, dtype)
            return
        kind, per, _, _ = MX_FORMATS[self.fmt]
        add_param(layer, "weight", (out_features, in_features // per), kind)
        add_param(layer, "weight_scale", (out_features, in_features // qf.MX_BLOCK), torch.uint8)

    serves_experts = True

    def expert_weight(self, layer: Linear) -> torch.Tensor:
        _, _, quantize, dequantize = MX_FORMATS[self.fmt]
        w = (dequantize(*quantize(layer.weight.data)) if self.online
             else dequantize(layer.weight.data, layer.weight_scale.data))
        return w.to(layer.quant_dtype)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x``'s rows quantized to the activations' MX format and back, in ``x``'s dtype."""
        _, _, quantize, dequantize = MX_FORMATS[self.act]
        return dequantize(*quantize(x)).to(x.dtype)

    def expert_activation(self) -> ActQuant | None:
        return None if self.act is None else (self._rows, self._rows)

    def process_weights_after_loading(self, layer: Linear) -> None:
        w = self.expert_weight(layer)
        drop_checkpoint_params(layer)
        layer.weight = nn.Parameter(w, requires_grad=False)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.act is not None:
            x2 = self._rows(x2)
        return dense_linear(x2, layer.weight, bias).reshape(*shape[:-1], -1)


class MXFP8Method(MXMethod):
    """MXFP8: e4m3 elements; scales rounded up (``2^ceil(log2(amax / 448))``), so nothing
    saturates."""

    fmt = "mxfp8"


class MXFP4Method(MXMethod):
    """MXFP4: E2M1 elements, two per byte; the OCP scale ``2^(floor(log2 amax) - 2)``,
    elements rounded to nearest (ties to even) and saturated at 6."""

    fmt = "mxfp4"


# ---------------------------------------------------------------- int8 W8A8


class Int8Method(LayerMethod):
    """int8 weights with per-channel scales; activations int8, symmetric, dynamic per token
    (``act="dynamic"``) or static per tensor (``"static"``); the integer product is exact
    (``torch._int_mm``), so rows never depend on each other. ``online``: quantize a dense
    checkpoint per output channel at load."""

    batch_invariant = True

    def __init__(self, *, act: str = "dynamic", online: bool = False) -> None:
        self.act, self.online = act, online
        self.expert_scales = ExpertInputScales()

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        if self.online:
            UnquantizedMethod().create_weights(layer, in_features, out_features, dtype)
            return
        add_param(layer, "weight", (out_features, in_features), torch.int8)
        add_param(layer, "weight_scale", (out_features, 1), torch.float32)
        if self.act == "static":
            n_shards = len(getattr(layer, "shards", None) or (1,))
            add_param(layer, "input_scale", (n_shards,), torch.float32, extent=lambda n: 1)

    serves_experts = True

    def _codes(self, layer: Linear) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 weight [N, K], float32 scales [N, 1]): the checkpoint's, or a dense
        checkpoint's quantized per output channel."""
        if self.online:
            w = layer.weight.data.to(torch.float32)
            scale = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127.0
            return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale
        return layer.weight.data, layer.weight_scale.data.to(torch.float32)

    def expert_weight(self, layer: Linear) -> torch.Tensor:
        q, scale = self._codes(layer)
        if self.act == "static":
            self.expert_scales.record(self.prefix, layer.input_scale.data)
        return (q.to(torch.float32) * scale.reshape(-1, 1)).to(layer.quant_dtype)

    def expert_activation(self) -> ActQuant | None:
        if self.act == "static":
            return self.expert_scales.act_quant(
                self.prefix, lambda x, s: qf.quantize_int8_static(x, s).to(torch.float32) * s)

        def rows(x: torch.Tensor) -> torch.Tensor:
            q, s = qf.quantize_int8_per_token(x)
            return (q.to(torch.float32) * s).to(x.dtype)
        return rows, rows

    def process_weights_after_loading(self, layer: Linear) -> None:
        q, scale = self._codes(layer)
        layer.kernel = packed_kernels(layer)
        if layer.kernel:  # [N, K], the Triton product (cuBLAS's above INT8_KERNEL_ROWS)
            layer.w_q = q.contiguous()
            layer.w_t = layer.w_q.t()  # a view, [K, N] column-major, for torch._int_mm
        else:
            layer.w_t = q.t().contiguous()  # [K, N] for torch._int_mm
        layer.w_scale = scale.reshape(1, -1).contiguous()
        layer.act_scale = (layer.input_scale.data.max().reshape(1, 1).float()
                           if self.act == "static" else None)
        drop_checkpoint_params(layer)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if layer.kernel and x2.is_cuda and x2.shape[0] > INT8_KERNEL_ROWS:
            from engine.runtime import quant_triton as qt

            static = layer.act_scale.reshape(1) if layer.act_scale is not None else None
            xq, sx = qt.quant_rows(x2, torch.int8, static=static)
            acc = int_product(xq, layer.w_t)
            y = (acc.to(torch.float32) * sx.reshape(-1, 1) * layer.w_scale).to(x.dtype)
            return (y if bias is None else y + bias).reshape(*shape[:-1], -1)
        if layer.kernel:
            from engine.runtime import quant_triton as qt

            static = layer.act_scale.reshape(1) if layer.act_scale is not None else None
            # rounded to x's dtype in the kernel on a GPU (the interpreter truncates instead)
            direct = bias is None and x2.is_cuda
            y = qt.w8_mm(x2, layer.w_q, layer.w_scale.reshape(-1),
                         act="token" if static is None else "static", x_scale=static,
                         out_dtype=x.dtype if direct else torch.float32)
            if not direct:
                y = y.to(x.dtype) if bias is None else y.to(x.dtype) + bias
            return y.reshape(*shape[:-1], -1)
        if layer.act_scale is None:
            xq, sx = qf.quantize_int8_per_token(x2)
        else:
            xq, sx = qf.quantize_int8_static(x2, layer.act_scale), layer.act_scale
        acc = int_product(xq, layer.w_t)
        y = (acc.to(torch.float32) * sx * layer.w_scale).to(x.dtype)
        if bias is not None:
            y = y + bias
        return y.reshape(*shape[:-1], -1)


# ---------------------------------------------------------------- formats of experts only


#: the checkpoint names of routed experts' layers (``...mlp.experts`` and its projections)
EXPERTS = re.compile(r"\.experts(\.|$)")


class OnlineExperts(LayerMethod):
    """Routed experts of a dense checkpoint quantized at load by a format that quantizes
    experts only: ``weights`` maps an expert projection's float32 weight [N, K] to the values
    the format keeps, ``activation`` is its rounding of the rows an expert multiplies (both
    projections' inputs; or ``None``). Emulated: the runner multiplies the kept values densely. Dense layers never get
    this method (a plugin hands it out for :data:`EXPERTS` names only)."""

    serves_experts = True

    def __init__(self, weights: Callable[[torch.Tensor], torch.Tensor],
                 activation: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.weights, self.activation = weights, activation

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        UnquantizedMethod().create_weights(layer, in_features, out_features, dtype)

    def expert_weight(self, layer: Linear) -> torch.Tensor:
        return self.weights(layer.weight.data.to(torch.float32)).to(layer.quant_dtype)

    def expert_activation(self) -> ActQuant | None:
        return None if self.activation is None else (self.activation, self.activation)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise TypeError(f"{self.prefix}: {type(self).__name__} quantizes routed experts only")


# ---------------------------------------------------------------- checkpoint claims


def claim(choice: str, quant_config: dict | None, accepts: Sequence[str], *,
          online: bool = False) -> dict | None:
    """The checkpoint's config when choice ``choice`` reads checkpoints whose ``quant_method``
    is one of ``accepts``; ``None`` for a dense checkpoint when the choice quantizes online.
    Otherwise a :class:`ConfigError` naming both the choice and what the checkpoint holds (a
    conflict, or a quantized method with no config to read)."""
    if not quant_config:
        if online:
            return None
        want = " or ".join(accepts)
        raise ConfigError(f"--quantization {choice}: the checkpoint is not quantized (no "
                          "quantization_config in config.json, no quantize_config.json or "
                          f"hf_quant_config.json); {choice} reads {want} checkpoints")
    method = str(quant_config.get("quant_method", "")).lower()
    if method not in accepts:
        reads = (f"reads {' or '.join(accepts)} checkpoints"
                 f"{' or quantizes a dense one' if online else ''}" if accepts
                 else "only quantizes a dense checkpoint")
        raise ConfigError(f"--quantization {choice} conflicts with the checkpoint, which is "
                          f"quantized with {method!r}; {choice} {reads}")
    return quant_config


def config_value(quant_config: dict, *keys: str, default: object = None) -> object:
    """The first of ``keys`` present in ``quant_config`` (formats spell fields differently:
    ``bits``/``w_bit``, ``group_size``/``q_group_size``...)."""
    for k in keys:
        if k in quant_config:
            return quant_config[k]
    return default


def unsupported(field: str, value: object, served: str) -> ConfigError:
    """The one-line error for a config field this build does not serve."""
    return ConfigError(f"quantization_config.{field} = {value!r}: {served}")
