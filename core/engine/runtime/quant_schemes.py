"""Checkpoint formats as layer methods, and the readers of each format's config.

Weight-only integer formats (GPTQ, AWQ, compressed-tensors pack-quantized and int weight-only,
MLX affine, NVFP4 weights) dequantize per fused shard at load (:class:`DequantizedMethod`);
the fp8 and int8 W8A8 schemes are :class:`Fp8Method` / :class:`Int8Method` configured from the
checkpoint. :class:`PerLayer` is what a plugin returns: it hands each layer its bound method
(``None`` keeps the layer dense: excluded layers, and ``lm_head`` unless the format says so).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from engine.errors import ConfigError
from engine.runtime import quant_formats as qf
from engine.runtime.linear import ActQuant, Linear, QuantMethod
from engine.runtime.quant_methods import (AffineShards, AffineWeight, DequantizedMethod,
                                          ExpertInputScales, LayerMethod, act_order,
                                          add_param, check_group, drop_checkpoint_params,
                                          fake_quant_fp8_rows, int_product, is_excluded,
                                          packed_extent)


def _shards(layer: Linear) -> list[tuple[int, int]]:
    """(start, size) of each fused shard along the output features."""
    sizes = getattr(layer, "shards", None) or (layer.out_features,)
    return [(sum(sizes[:i]), s) for i, s in enumerate(sizes)]


#: code widths the packed GPU product reads (whole codes to a 32-bit word)
_PACKED_BITS = (2, 4, 8)


def _affine_by_order(layer: Linear, g_idxs: list[torch.Tensor], codes: torch.Tensor,
                     scale: torch.Tensor, bias: torch.Tensor, bits: int
                     ) -> AffineWeight | AffineShards | None:
    """The affine weight of [N, K] ``codes`` with per-group ``scale``/``bias`` [N, K/g] whose
    shards each have a group index of the columns (act order): one permutation when the shards
    agree (as GPTQ's q/k/v, quantized from the same inputs, do), else one weight per shard;
    ``None`` when a group is not ``group`` columns."""
    orders = [act_order(g, layer.group) for g in g_idxs]
    if not all(ok for ok, _ in orders):
        return None
    perms = [p for _, p in orders]
    same = all(torch.equal(g, g_idxs[0]) for g in g_idxs[1:])
    if same or len(perms) == 1:
        perm = perms[0]
        return AffineWeight(codes if perm is None else codes[:, perm], scale, bias, bits,
                            layer.group, perm)
    parts = []
    for (start, size), perm in zip(_shards(layer), perms):
        rows = slice(start, start + size)
        c = codes[rows] if perm is None else codes[rows][:, perm]
        parts.append(AffineWeight(c, scale[rows], bias[rows], bits, layer.group, perm))
    return AffineShards(parts)


def _optional(param: torch.nn.Parameter) -> None:
    param.optional = True  # the loader accepts a checkpoint without it (its default stays)


class GPTQMethod(DequantizedMethod):
    """GPTQ ``qweight``/``qzeros``/``scales``/``g_idx`` (2, 4 or 8 bits; act-order included:
    each shard's ``g_idx`` is used as stored); v1 zeros are stored minus one."""

    def __init__(self, bits: int, group_size: int, desc_act: bool, zero_offset: int) -> None:
        self.bits, self.group_size, self.desc_act, self.zero_offset = bits, group_size, \
            desc_act, zero_offset

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        g = check_group(self.prefix, k, self.group_size)
        per = 32 // self.bits
        if k % per:
            raise ConfigError(f"{self.prefix}: in_features {k} is not a multiple of {per}")
        layer.group = g
        add_param(layer, "qweight", (k // per, n), torch.int32, dim=1)
        add_param(layer, "qzeros", (k // g, n // per), torch.int32, dim=1,
                  extent=packed_extent(per, "qzeros"))
        add_param(layer, "scales", (k // g, n), torch.float32, dim=1)
        g_idx = add_param(layer, "g_idx", (len(_shards(layer)), k), torch.int32,
                          extent=lambda s: 1)
        g_idx.data.copy_((torch.arange(k) // g).expand_as(g_idx))
        if not self.desc_act:
            _optional(g_idx)

    def dequantize(self, layer: Linear) -> torch.Tensor:
        per = 32 // self.bits
        out = []
        for i, (start, size) in enumerate(_shards(layer)):
            cols, zcols = slice(start, start + size), slice(start // per, (start + size) // per)
            out.append(qf.dequant_gptq(layer.qweight.data[:, cols], layer.qzeros.data[:, zcols],
                                       layer.scales.data[:, cols], layer.g_idx.data[i],
                                       self.bits, self.zero_offset))
        return torch.cat(out)

    def affine(self, layer: Linear) -> AffineWeight | AffineShards | None:
        if self.bits not in _PACKED_BITS:
            return None
        q = qf.unpack_int32(layer.qweight.data, self.bits, 0).t()  # [N, K]
        z = (qf.unpack_int32(layer.qzeros.data, self.bits, 1) + self.zero_offset).t()
        s = layer.scales.data.to(torch.float32).t()  # [N, K/g]
        return _affine_by_order(layer, list(layer.g_idx.data), q, s, -(z * s), self.bits)


class AWQMethod(DequantizedMethod):
    """AWQ GEMM layout: 4-bit, ``qweight``/``qzeros`` packed along N in AWQ order."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        g = check_group(self.prefix, k, self.group_size)
        layer.group = g
        add_param(layer, "qweight", (k, n // 8), torch.int32, dim=1,
                  extent=packed_extent(8, "qweight"))
        add_param(layer, "qzeros", (k // g, n // 8), torch.int32, dim=1,
                  extent=packed_extent(8, "qzeros"))
        add_param(layer, "scales", (k // g, n), torch.float32, dim=1)

    def dequantize(self, layer: Linear) -> torch.Tensor:
        return qf.dequant_awq(layer.qweight.data, layer.qzeros.data, layer.scales.data,
                              layer.group)

    def affine(self, layer: Linear) -> AffineWeight | None:
        q = qf.awq_unpack(layer.qweight.data).t()  # [N, K]
        z = qf.awq_unpack(layer.qzeros.data).t()
        s = layer.scales.data.to(torch.float32).t()
        return AffineWeight(q, s, -(z * s), 4, layer.group)


class PackQuantizedMethod(DequantizedMethod):
    """compressed-tensors ``pack-quantized`` (WNA16): ``weight_packed`` along K, per-group or
    per-channel ``weight_scale``, optional packed ``weight_zero_point`` and ``weight_g_idx``."""

    def __init__(self, bits: int, group_size: int, symmetric: bool, g_idx: bool) -> None:
        self.bits, self.group_size, self.symmetric, self.has_g_idx = bits, group_size, \
            symmetric, g_idx

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        g = check_group(self.prefix, k, self.group_size, "config_groups.weights.group_size")
        per = 32 // self.bits
        layer.group = g
        s = len(_shards(layer))
        add_param(layer, "weight_packed", (n, k // per), torch.int32)
        add_param(layer, "weight_scale", (n, k // g), torch.float32)
        add_param(layer, "weight_shape", (s, 2), torch.int64, extent=lambda _: 1)
        if not self.symmetric:
            add_param(layer, "weight_zero_point", (n // per, k // g), torch.int32,
                      extent=packed_extent(per, "weight_zero_point"))
        if self.has_g_idx:
            add_param(layer, "weight_g_idx", (s, k), torch.int32, extent=lambda _: 1)

    def dequantize(self, layer: Linear) -> torch.Tensor:
        per, out = 32 // self.bits, []
        k = layer.in_features
        for i, (start, size) in enumerate(_shards(layer)):
            shape = tuple(int(v) for v in layer.weight_shape.data[i])
            if shape != (size, k):
                raise ConfigError(f"{self.prefix}: weight_shape {list(shape)} of shard {i} "
                                  f"disagrees with the layer ({size}, {k})")
            rows = slice(start, start + size)
            zp = (layer.weight_zero_point.data[start // per:(start + size) // per]
                  if not self.symmetric else None)
            g_idx = layer.weight_g_idx.data[i] if self.has_g_idx else None
            out.append(qf.dequant_pack_quantized(layer.weight_packed.data[rows],
                                                 layer.weight_scale.data[rows], self.bits,
                                                 layer.group, zp, g_idx))
        return torch.cat(out)

    def affine(self, layer: Linear) -> AffineWeight | AffineShards | None:
        """Stored codes are ``q + 2^(bits-1)``: ``W = stored * s - (2^(bits-1) + zero) * s``."""
        if self.bits not in _PACKED_BITS:
            return None
        k = layer.in_features
        for i, (_, size) in enumerate(_shards(layer)):
            if tuple(int(v) for v in layer.weight_shape.data[i]) != (size, k):
                return None  # dequantize() names the disagreement
        q = qf.unpack_int32(layer.weight_packed.data, self.bits, 1)  # [N, K] stored codes
        s = layer.weight_scale.data.to(torch.float32)
        offset = float(1 << (self.bits - 1))
        z = (qf.unpack_int32(layer.weight_zero_point.data, self.bits, 0) - (1 << (self.bits - 1))
             if not self.symmetric else torch.zeros_like(s))
        b = -((z + offset) * s)
        if not self.has_g_idx:
            return AffineWeight(q, s, b, self.bits, layer.group)
        return _affine_by_order(layer, list(layer.weight_g_idx.data), q, s, b, self.bits)


class IntWeightOnlyMethod(DequantizedMethod):
    """Symmetric int8 (or int4 held in int8) weights [N, K] with per-channel or per-group
    ``weight_scale`` (compressed-tensors ``int-quantized`` W8A16)."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        layer.group = check_group(self.prefix, k, self.group_size,
                                  "config_groups.weights.group_size")
        add_param(layer, "weight", (n, k), torch.int8)
        add_param(layer, "weight_scale", (n, k // layer.group), torch.float32)

    def dequantize(self, layer: Linear) -> torch.Tensor:
        s = layer.weight_scale.data.repeat_interleave(layer.group, 1)
        return layer.weight.data.to(torch.float32) * s

    def affine(self, layer: Linear) -> AffineWeight | None:
        s = layer.weight_scale.data.to(torch.float32)
        return AffineWeight(layer.weight.data.to(torch.int32) + 128, s, -128.0 * s, 8,
                            layer.group)


class MLXMethod(DequantizedMethod):
    """MLX affine: ``weight`` uint32 codes along K, ``scales`` and ``biases`` per group."""

    def __init__(self, bits: int, group_size: int) -> None:
        self.bits, self.group_size = bits, group_size

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        g = check_group(self.prefix, k, self.group_size)
        layer.group = g
        add_param(layer, "weight", (n, k * self.bits // 32), torch.int32)
        add_param(layer, "scales", (n, k // g), torch.float32)
        add_param(layer, "biases", (n, k // g), torch.float32)

    def dequantize(self, layer: Linear) -> torch.Tensor:
        return qf.dequant_mlx(layer.weight.data, layer.scales.data, layer.biases.data,
                              self.bits, layer.group)

    def affine(self, layer: Linear) -> AffineWeight | None:
        if self.bits not in _PACKED_BITS:
            return None
        return AffineWeight(qf.unpack_int32(layer.weight.data, self.bits, 1),
                            layer.scales.data, layer.biases.data, self.bits, layer.group)


class NVFP4WeightMethod(DequantizedMethod):
    """ModelOpt NVFP4 weights (e2m1 pairs, e4m3 scale per 16, fp32 ``weight_scale_2`` per
    shard) served weight-only, as Hopper-class GPUs serve them: activations stay unquantized."""

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        check_group(self.prefix, k, 16)
        s = len(_shards(layer))
        add_param(layer, "weight", (n, k // 2), torch.uint8)
        add_param(layer, "weight_scale", (n, k // 16), torch.float8_e4m3fn)
        add_param(layer, "weight_scale_2", (s,), torch.float32, extent=lambda _: 1)
        _optional(add_param(layer, "input_scale", (s,), torch.float32, extent=lambda _: 1))

    def dequantize(self, layer: Linear) -> torch.Tensor:
        w = qf.dequant_e2m1(layer.weight.data)
        w = w * layer.weight_scale.data.to(torch.float32).repeat_interleave(16, 1)
        sizes = torch.tensor([s for _, s in _shards(layer)], device=w.device)
        return w * torch.repeat_interleave(layer.weight_scale_2.data, sizes).reshape(-1, 1)


class BnB4bitMethod(DequantizedMethod):
    """bitsandbytes 4-bit (nf4 or fp4, blocks of 64, optional double quantization); the
    checkpoint's ``weight.absmax``-style names are renamed by :func:`bnb_rewrite`."""

    def __init__(self, double_quant: bool, blocksize: int = 64) -> None:
        self.double_quant, self.blocksize = double_quant, blocksize

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        bs, s = self.blocksize, len(_shards(layer))
        blocks = lambda m: -(-m * k // bs)  # noqa: E731
        shards = getattr(layer, "shards", None) or (n,)
        if any(m * k % bs for m in shards):
            raise ConfigError(f"{self.prefix}: {k} inputs per row do not fill blocks of {bs}")
        add_param(layer, "weight", (n * k // 2, 1), torch.uint8, extent=lambda m: m * k // 2)
        add_param(layer, "weight_absmax", (sum(blocks(m) for m in shards),),
                  torch.uint8 if self.double_quant else torch.float32, extent=blocks)
        add_param(layer, "weight_quant_map", (16,), torch.float32, dim=None)
        if self.double_quant:
            nested = lambda m: -(-blocks(m) // 256)  # noqa: E731
            add_param(layer, "weight_nested_absmax", (sum(nested(m) for m in shards),),
                      torch.float32, extent=nested)
            add_param(layer, "weight_nested_quant_map", (256,), torch.float32, dim=None)
            add_param(layer, "weight_nested_offset", (s,), torch.float32, extent=lambda _: 1)

    def dequantize(self, layer: Linear) -> torch.Tensor:
        k, bs, out = layer.in_features, self.blocksize, []
        wrow = brow = nrow = 0
        for i, (_, m) in enumerate(_shards(layer)):
            nb = m * k // bs
            nested = None
            if self.double_quant:
                nn_ = -(-nb // 256)
                nested = (layer.weight_nested_quant_map.data,
                          layer.weight_nested_absmax.data[nrow:nrow + nn_],
                          float(layer.weight_nested_offset.data[i]))
                nrow += nn_
            out.append(qf.dequant_bnb4(layer.weight.data[wrow:wrow + m * k // 2],
                                       layer.weight_quant_map.data,
                                       layer.weight_absmax.data[brow:brow + nb], (m, k), bs,
                                       nested))
            wrow, brow = wrow + m * k // 2, brow + nb
        return torch.cat(out)


class W4AFp8ExpertMethod(LayerMethod):
    """A routed expert projection of a ``w4afp8`` checkpoint: ``weight`` int8 [N, K/2] (two
    signed int4 codes per byte, the even column in the low nibble), ``weight_scale_inv`` float32
    [N, K/group] (``W = q * scale`` per group along K) and ``input_scale``, the static fp8
    scale of the rows it multiplies. As the format's kernels do, each layer's experts share one
    scale per input (:class:`ExpertInputScales`). Emulated: the rows are
    rounded to fp8 e4m3 with that scale and multiplied by the dequantized weight."""

    serves_experts = True

    def __init__(self, group: int = 128) -> None:
        self.group = group
        self.scales = ExpertInputScales()

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        check_group(self.prefix, k, self.group, "group_size")
        if k % 2:
            raise ConfigError(f"{self.prefix}: {k} inputs do not pack two codes per byte")
        add_param(layer, "weight", (n, k // 2), torch.int8)
        add_param(layer, "weight_scale_inv", (n, k // self.group), torch.float32)
        add_param(layer, "input_scale", (1,), torch.float32, extent=lambda _: 1)

    def expert_weight(self, layer: Linear) -> torch.Tensor:
        self.scales.record(self.prefix, layer.input_scale.data)
        q = qf.unpack_int4_pairs(layer.weight.data).to(torch.float32)
        s = layer.weight_scale_inv.data.to(torch.float32).repeat_interleave(self.group, 1)
        return (q * s).to(layer.quant_dtype)

    def expert_activation(self) -> ActQuant:
        return self.scales.act_quant(
            self.prefix, lambda x, s: fake_quant_fp8_rows(x, torch.float8_e4m3fn, scale=s))

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise TypeError(f"{self.prefix}: int4 weights with fp8 activations are served for "
                        "routed experts only")


class ModelSlimW8A8Method(LayerMethod):
    """msModelSlim ``W8A8`` (static): ``weight`` int8 [N, K]; per shard a static asymmetric
    activation quantization (``input_scale``, ``input_offset``: ``x_q = clamp(round(x / s +
    o), -128, 127)``); ``quant_bias`` int32 [N] (``-o`` times the row sums of the codes, plus
    the bias in output units) and ``deq_scale`` [N] (``input_scale * weight_scale``), so
    ``y = (x_q @ W^T + quant_bias) * deq_scale``: the integer arithmetic of the NPU kernel,
    exact here (``torch._int_mm``). ``weight_scale``/``weight_offset`` are read and unused.
    Each fused shard quantizes the input with its own scale and offset."""

    batch_invariant = True

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        s = len(_shards(layer))
        add_param(layer, "weight", (n, k), torch.int8)
        add_param(layer, "quant_bias", (n,), torch.int32)
        add_param(layer, "deq_scale", (n,), torch.float32)
        add_param(layer, "input_scale", (s,), torch.float32, extent=lambda _: 1)
        add_param(layer, "input_offset", (s,), torch.float32, extent=lambda _: 1)
        for name in ("weight_scale", "weight_offset"):
            _optional(add_param(layer, name, (n, 1), torch.float32))

    def process_weights_after_loading(self, layer: Linear) -> None:
        layer.w_t = layer.weight.data.t().contiguous()
        layer.qbias = layer.quant_bias.data.to(torch.int32)
        layer.deq = layer.deq_scale.data.to(torch.float32)
        layer.act = [(float(layer.input_scale.data[i]), float(layer.input_offset.data[i]))
                     for i in range(len(_shards(layer)))]
        drop_checkpoint_params(layer)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.float32)
        out = []
        for (start, size), (scale, offset) in zip(_shards(layer), layer.act):
            xq = torch.round(x2 / scale + offset).clamp(-128, 127).to(torch.int8)
            cols = slice(start, start + size)
            acc = int_product(xq, layer.w_t[:, cols]) + layer.qbias[cols]
            out.append(acc.to(torch.float32) * layer.deq[cols])
        y = torch.cat(out, -1).to(x.dtype)
        if bias is not None:
            y = y + bias
        return y.reshape(*shape[:-1], -1)


class ModelSlimDynamicMethod(LayerMethod):
    """msModelSlim ``W8A8_DYNAMIC`` (``bits`` 8) and ``W4A4_DYNAMIC`` (4: int4 codes in an int8
    container): ``weight`` [N, K] with per-channel ``weight_scale`` and ``weight_offset``
    (``W = (q - offset) * scale``); activations quantized per token, symmetric, dynamic, to the
    same width (scale: the row's absolute maximum over 127 or 7); the integer product is exact
    (``torch._int_mm``)."""

    batch_invariant = True

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        add_param(layer, "weight", (n, k), torch.int8)
        add_param(layer, "weight_scale", (n, 1), torch.float32)
        _optional(add_param(layer, "weight_offset", (n, 1), torch.float32))

    def process_weights_after_loading(self, layer: Linear) -> None:
        off = layer.weight_offset.data.to(torch.float32)
        if not torch.equal(off, torch.round(off)):
            raise ConfigError(f"{self.prefix}: weight_offset holds non-integer values")
        q = layer.weight.data.to(torch.int32) - off.to(torch.int32)
        lo, hi = -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        if self.bits < 8 and (q.min() < lo or q.max() > hi):
            raise ConfigError(f"{self.prefix}: weight codes outside the int{self.bits} range")
        layer.w_t = q.clamp(-128, 127).to(torch.int8).t().contiguous()
        layer.w_scale = layer.weight_scale.data.to(torch.float32).reshape(1, -1)
        drop_checkpoint_params(layer)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        xf = x.reshape(-1, shape[-1]).to(torch.float32)
        qmax = (1 << (self.bits - 1)) - 1
        sx = (xf.abs().amax(-1, keepdim=True) / qmax).clamp(min=1e-12)
        xq = torch.round(xf / sx).clamp(-qmax - 1, qmax).to(torch.int8)
        y = (int_product(xq, layer.w_t).to(torch.float32) * sx * layer.w_scale).to(x.dtype)
        if bias is not None:
            y = y + bias
        return y.reshape(*shape[:-1], -1)


class BnB8bitMethod(LayerMethod):
    """bitsandbytes LLM.int8: ``weight`` int8 [N, K] with ``SCB`` [N] (each row's absmax, so
    ``W = weight * SCB / 127``), the activations quantized per row to int8 at each call with
    the columns holding an outlier (``|x| >= threshold`` in float16) taken out and multiplied
    in full precision against the dequantized weight columns, as bitsandbytes' reference
    operators compute it (the same float16 cast, statistics, rounding, integer product and
    scale order). ``threshold`` 0: every column in int8. The outlier columns depend on the
    whole batch, as they do in the library."""

    def __init__(self, threshold: float = 6.0) -> None:
        self.threshold = float(threshold)

    def create_weights(self, layer: Linear, k: int, n: int, dtype: torch.dtype) -> None:
        layer.quant_dtype = dtype
        add_param(layer, "weight", (n, k), torch.int8)
        add_param(layer, "SCB", (n,), torch.float32)
        fmt = add_param(layer, "weight_format", (len(_shards(layer)),), torch.uint8,
                        extent=lambda _: 1)
        _optional(fmt)  # 0: row-major, the only layout bitsandbytes still writes

    def process_weights_after_loading(self, layer: Linear) -> None:
        if int(layer.weight_format.data.max()) != 0:
            raise ConfigError(f"{self.prefix}: weight_format "
                              f"{int(layer.weight_format.data.max())} (only 0, row-major, is "
                              "read)")
        q, scb = layer.weight.data, layer.SCB.data.to(torch.float32)
        layer.w_q, layer.w_t, layer.scb = q, q.t().contiguous(), scb
        drop_checkpoint_params(layer)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        a = x.reshape(-1, shape[-1])
        a16 = a.to(torch.float16)
        cols = None
        if self.threshold > 0:
            outliers = a16.abs() >= self.threshold
            if outliers.any():
                cols = outliers.any(0).nonzero().view(-1)
                a16 = a16.masked_fill(outliers, 0)
        rows = a16.abs().amax(1).float()
        rows = torch.where(rows > 0, rows, torch.ones_like(rows))  # an all-zero row stays 0
        ca = torch.round(a16 * (127.0 / rows.unsqueeze(-1))).to(torch.int8)
        if cols is not None and a.shape[0] > 1:
            ca[:, cols] = 0
        acc = int_product(ca, layer.w_t)
        y = acc * (rows.unsqueeze(-1) * layer.scb.unsqueeze(0)) * 6.200124e-05  # 1 / 127^2
        if bias is not None:
            y += bias
        if cols is not None:
            sub_w = layer.w_q[:, cols] * layer.scb.view(-1, 1) * 7.874015718698502e-3  # / 127
            y = y.addmm(a[:, cols].to(y.dtype), sub_w.t())
        return y.to(x.dtype).reshape(*shape[:-1], -1)


def bnb_rewrite(quant_type: str, blocksize: int = 64
                ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """bitsandbytes names (``q_proj.weight.absmax``...) to parameter names
    (``q_proj.weight_absmax``); each ``weight.quant_state.bitsandbytes__<type>`` JSON is checked
    against the config (type, block size) and yields the shard's ``weight_nested_offset``."""
    import json

    def rewrite(weights: Iterator[Any]) -> Iterator[Any]:
        for name, tensor in weights:
            head, sep, tail = name.partition(".weight.")
            if not sep:
                yield name, tensor
            elif tail.startswith("quant_state."):
                state = json.loads(bytes(tensor.tolist()))
                if state.get("quant_type") != quant_type or state.get("blocksize") != blocksize:
                    raise ConfigError(f"checkpoint tensor {name!r}: quant_type "
                                      f"{state.get('quant_type')!r}, blocksize "
                                      f"{state.get('blocksize')} (the config says {quant_type!r} "
                                      f"in blocks of {blocksize})")
                if "nested_offset" in state:
                    yield f"{head}.weight_nested_offset", torch.tensor(
                        float(state["nested_offset"]))
            else:
                yield f"{head}.weight_{tail}", tensor
    return rewrite


class PerLayer(QuantMethod):
    """The method a plugin returns: ``scheme(name)`` gives each layer's method (``None``: dense);
    ``lm_head`` stays dense unless ``head`` is set."""

    def __init__(self, scheme: Callable[[str], LayerMethod | None], head: bool = False,
                 rewrite: Callable[[Iterator[Any]], Iterator[Any]] | None = None) -> None:
        self.scheme, self.head, self.rewrite = scheme, head, rewrite

    def checkpoint_weights(self, weights: Iterator[Any]) -> Iterator[Any]:
        return weights if self.rewrite is None else self.rewrite(weights)

    def for_layer(self, name: str) -> QuantMethod | None:
        if name == "lm_head" and not self.head:
            return None
        method = self.scheme(name)
        return None if method is None else method.bind(name)

    def create_weights(self, layer: Linear, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        raise TypeError("PerLayer hands out per-layer methods through for_layer")

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise TypeError("PerLayer hands out per-layer methods through for_layer")


def excluding(patterns: Any, method: LayerMethod) -> Callable[[str], LayerMethod | None]:
    """``method`` for every layer but those the checkpoint's exclusion list names."""
    pats = [patterns] if isinstance(patterns, str) else list(patterns or [])
    return lambda name: None if is_excluded(name, pats) else method


def mlx_dense_embeddings(bits: int, group_size: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A checkpoint rewrite that dequantizes MLX's quantized ``embed_tokens`` and ``lm_head``
    (``weight``/``scales``/``biases`` triples) into dense weights; other tensors pass."""
    owners = ("model.embed_tokens", "lm_head")

    def rewrite(weights: Iterator[Any]) -> Iterator[Any]:
        held: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in weights:
            owner, _, leaf = name.rpartition(".")
            if owner not in owners or leaf not in ("weight", "scales", "biases"):
                yield name, tensor
                continue
            parts = held.setdefault(owner, {})
            parts[leaf] = tensor
            if "scales" not in parts and parts.get("weight") is not None \
                    and parts["weight"].is_floating_point():
                yield name, held.pop(owner)["weight"]  # a dense embedding
            elif len(parts) == 3:
                w = parts["weight"]
                w = w.view(torch.int32) if w.dtype == torch.uint32 else w
                yield f"{owner}.weight", qf.dequant_mlx(w, parts["scales"], parts["biases"],
                                                        bits, group_size)
                del held[owner]
        if held:
            raise ConfigError(f"MLX tensors of {', '.join(held)} are incomplete (need weight, "
                              "scales and biases)")
    return rewrite
