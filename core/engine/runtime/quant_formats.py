"""The arithmetic of quantized checkpoint formats: bit packing, dequantization, and the
activation quantizers of the W8A8 schemes.

Pure tensor functions shared by every quantization plugin (through :mod:`engine.api.quant`)
and by the checkpoint writers of :mod:`engine.testing.quant`. Dequantizers return float32
``[out_features, in_features]``; nothing here depends on a device.

Layouts (all integer codes LSB-first inside little-endian int32 words):

- GPTQ: ``qweight`` [K/p, N] packed along K; ``qzeros`` [K/g, N/p] packed along N, stored as
  ``zero - 1`` by the v1 format; ``scales`` [K/g, N]; ``g_idx`` [K] (the group of input row k).
- AWQ: ``qweight`` [K, N/8] and ``qzeros`` [K/g, N/8] packed along N in the order
  :data:`AWQ_ORDER`; ``scales`` [K/g, N]; 4-bit only.
- compressed-tensors pack-quantized: ``weight_packed`` [N, K/p] packed along K as ``q + 2^(b-1)``;
  ``weight_scale`` [N, K/g]; ``weight_zero_point`` [N/p, K/g] packed along N.
- MLX affine: ``weight`` uint32 [N, K*b/32] packed along K; ``scales``/``biases`` [N, K/g];
  ``W = q * scale + bias``.
- MXFP8 (OCP MX): ``weight`` e4m3 [N, K]; ``weight_scale`` uint8 [N, K/32], UE8M0 exponents
  (``2^(e - 127)``, 255 is NaN); activations quantized the same way per token and 32 columns.
- MXFP4 (OCP MX, Quark's export): ``weight`` uint8 [N, K/2], two E2M1 codes per byte (low nibble
  first); ``weight_scale`` uint8 [N, K/32], UE8M0.
"""

from __future__ import annotations

import torch

#: nibble i of an AWQ word holds column 8j + AWQ_ORDER[i]
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
#: largest magnitudes of the fp8 formats
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
#: E2M1 (fp4) code -> value; bit 3 is the sign
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0,
               -4.0, -6.0)


def _words(packed: torch.Tensor) -> torch.Tensor:
    """int32/uint32 words as int64 holding the unsigned 32-bit value."""
    w = packed.to(torch.int64) if packed.dtype != torch.uint32 else packed.view(torch.int32).to(
        torch.int64)
    return w & 0xFFFFFFFF


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned ``bits``-bit codes packed LSB-first into 32-bit words along ``dim`` -> int32
    codes, that dimension ``32 // bits`` times longer. ``bits`` must divide 32."""
    if 32 % bits:
        raise ValueError(f"{bits}-bit codes do not fit whole into 32-bit words")
    per = 32 // bits
    w = _words(packed).movedim(dim, -1)
    shifts = torch.arange(per, dtype=torch.int64, device=w.device) * bits
    codes = (w.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    codes = codes.reshape(*w.shape[:-1], w.shape[-1] * per)
    return codes.to(torch.int32).movedim(-1, dim).contiguous()


def pack_int32(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The inverse of :func:`unpack_int32`: int32 words (two's complement of the word)."""
    per = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    if c.shape[-1] % per:
        raise ValueError(f"{c.shape[-1]} codes do not fill whole words of {per}")
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per, per)
    shifts = torch.arange(per, dtype=torch.int64, device=c.device) * bits
    words = ((c & ((1 << bits) - 1)) << shifts).sum(-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """AWQ int32 [R, N/8] -> int32 codes [R, N] in column order."""
    codes = unpack_int32(packed, 4, 1)
    r, n = codes.shape
    inverse = torch.tensor([AWQ_ORDER.index(i) for i in range(8)], device=codes.device)
    return codes.reshape(r, n // 8, 8)[:, :, inverse].reshape(r, n)


def awq_pack(codes: torch.Tensor) -> torch.Tensor:
    """int codes [R, N] -> AWQ int32 [R, N/8]."""
    r, n = codes.shape
    order = torch.tensor(AWQ_ORDER, device=codes.device)
    return pack_int32(codes.reshape(r, n // 8, 8)[:, :, order].reshape(r, n), 4, 1)


def dequant_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 g_idx: torch.Tensor, bits: int, zero_offset: int = 1) -> torch.Tensor:
    """W [N, K] = scales[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n]); the v1 format stores
    ``zero - 1`` (``zero_offset=1``), v2 the zero itself (``0``)."""
    q = unpack_int32(qweight, bits, 0)  # [K, N]
    z = unpack_int32(qzeros, bits, 1) + zero_offset  # [K/g, N]
    g = g_idx.long()
    w = (q - z[g]).to(torch.float32) * scales.to(torch.float32)[g]
    return w.t().contiguous()


def dequant_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """W [N, K] = (q - zero) * scale per group of ``group_size`` input rows."""
    q = awq_unpack(qweight)  # [K, N]
    z = awq_unpack(qzeros).repeat_interleave(group_size, 0)
    s = scales.to(torch.float32).repeat_interleave(group_size, 0)
    return ((q - z).to(torch.float32) * s).t().contiguous()


def dequant_pack_quantized(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                           bits: int, group_size: int, zero_point: torch.Tensor | None = None,
                           g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """compressed-tensors pack-quantized -> W [N, K] = (q - zero) * scale, where ``q`` is the
    stored code minus ``2^(bits-1)`` and ``zero`` the (packed, signed) zero point or 0."""
    q = unpack_int32(weight_packed, bits, 1) - (1 << (bits - 1))  # [N, K]
    k = q.shape[1]
    groups = (g_idx.long() if g_idx is not None
              else torch.arange(k, device=q.device) // group_size)
    s = weight_scale.to(torch.float32)[:, groups]
    if zero_point is None:
        return q.to(torch.float32) * s
    z = unpack_int32(zero_point, bits, 0) - (1 << (bits - 1))  # [N, K/g]
    return (q - z[:, groups]).to(torch.float32) * s


def dequant_mlx(weight: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                bits: int, group_size: int) -> torch.Tensor:
    """MLX affine -> W [N, K] = q * scale + bias per group along K."""
    q = unpack_int32(weight, bits, 1).to(torch.float32)
    s = scales.to(torch.float32).repeat_interleave(group_size, 1)
    b = biases.to(torch.float32).repeat_interleave(group_size, 1)
    return q * s + b


def dequant_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2], two E2M1 codes per byte (low nibble = even index) -> float32 [N, K]."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    lo, hi = (packed & 0xF).long(), (packed >> 4).long()
    return torch.stack([table[lo], table[hi]], -1).reshape(packed.shape[0], -1)


#: the NF4 code book (QLoRA's normal-float 4-bit levels), as bitsandbytes stores it
NF4_VALUES = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
              -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
              0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
              0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)


def dequant_bnb4(data: torch.Tensor, quant_map: torch.Tensor, absmax: torch.Tensor,
                 shape: tuple[int, int], blocksize: int = 64,
                 nested: tuple[torch.Tensor, torch.Tensor, float] | None = None
                 ) -> torch.Tensor:
    """bitsandbytes 4-bit (nf4/fp4): bytes of two codes (high nibble first) over the flattened
    weight, ``quant_map[code] * absmax[block]``; with double quantization ``absmax`` holds uint8
    codes and ``nested`` = (nested_quant_map, nested_absmax per 256 blocks, nested_offset)."""
    b = data.reshape(-1)
    codes = torch.stack([(b >> 4) & 15, b & 15], -1).reshape(-1).long()
    if nested is not None:
        nmap, nabs, offset = nested
        scale = nabs.to(torch.float32).repeat_interleave(256)[:absmax.numel()]
        absmax = nmap.to(torch.float32)[absmax.long()] * scale + offset
    vals = quant_map.to(torch.float32)[codes].reshape(-1, blocksize)
    return (vals * absmax.to(torch.float32).reshape(-1, 1)).reshape(shape)


def expand_blocks(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int]
                  ) -> torch.Tensor:
    """A [ceil(rows/bn), ceil(cols/bk)] block scale expanded to [rows, cols]."""
    bn, bk = block
    s = scale.to(torch.float32).repeat_interleave(bn, 0).repeat_interleave(bk, 1)
    return s[:rows, :cols]


# ---------------------------------------------------------------- activation quantizers


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` saturated to the fp8 range and rounded to ``dtype``."""
    m = FP8_MAX[dtype]
    return (x.to(torch.float32) / scale).clamp(-m, m).to(dtype)


def fp8_scale_per_token(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[M, 1] float32 dynamic scales: the row's absolute maximum over the format's maximum."""
    amax = x.to(torch.float32).abs().amax(-1, keepdim=True)
    return amax.clamp(min=1e-12) / FP8_MAX[dtype]


def quantize_fp8_groups(x: torch.Tensor, dtype: torch.dtype,
                        group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic fp8 codes [M, K] and float32 scales [M, K / group] per token and group of
    ``group`` columns (``K`` a multiple of it): the values :func:`fake_quant_fp8` hands the
    matmul are ``codes * scale``."""
    m, k = x.shape
    xg = x.to(torch.float32).reshape(m, k // group, group)
    s = fp8_scale_per_token(xg, dtype)
    return quantize_fp8(xg, s, dtype).reshape(m, k), s.reshape(m, k // group)


def fake_quant_fp8(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None,
                   group: int | None = None) -> torch.Tensor:
    """The float32 values an fp8 activation quantizer hands the matmul: dynamic per token
    (``scale`` None), dynamic per token and group of ``group`` columns, or static ``scale``."""
    x = x.to(torch.float32)
    if group is not None:
        m, k = x.shape
        codes, s = quantize_fp8_groups(torch.nn.functional.pad(x, (0, (-k) % group)), dtype,
                                       group)
        return (codes.to(torch.float32).reshape(m, -1, group) * s[..., None]).reshape(m, -1)[
            :, :k]
    if scale is None:
        scale = fp8_scale_per_token(x, dtype)
    return quantize_fp8(x, scale, dtype).to(torch.float32) * scale


#: elements of one MX block
MX_BLOCK = 32


def e8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 exponents (uint8) -> float32 scales ``2^(e - 127)`` (255: NaN)."""
    x = torch.ldexp(torch.ones(e.shape, dtype=torch.float32, device=e.device),
                    e.to(torch.int32) - 127)
    return torch.where(e == 255, torch.full_like(x, float("nan")), x)


def mx_exponents(amax: torch.Tensor, elem_max: float) -> torch.Tensor:
    """UE8M0 exponents (uint8) of the smallest power-of-two scales with ``amax / scale <=
    elem_max``: ``2^ceil(log2(amax / elem_max))`` (scales rounded up, so no element saturates),
    exactly (``frexp``); an all-zero block gets the smallest scale."""
    m, p = torch.frexp(amax.to(torch.float32) / elem_max)  # r = m * 2^p, m in [0.5, 1)
    e = torch.where(m == 0.5, p - 1, p)  # r a power of two: its own exponent
    e = torch.where(amax > 0, e, torch.full_like(e, -127))
    return (e.clamp(-127, 127) + 127).to(torch.uint8)


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] (K a multiple of 32) -> (e4m3 [M, K], UE8M0 exponents uint8 [M, K/32])."""
    m, k = x.shape
    xg = x.to(torch.float32).reshape(m, k // MX_BLOCK, MX_BLOCK)
    e = mx_exponents(xg.abs().amax(-1), FP8_MAX[torch.float8_e4m3fn])
    scale = e8m0_to_float(e)[..., None]
    q = (xg / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.reshape(m, k), e


def dequant_mxfp8(q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """e4m3 [N, K] and UE8M0 exponents [N, K/32] -> float32 [N, K]."""
    return q.to(torch.float32) * e8m0_to_float(e).repeat_interleave(MX_BLOCK, 1)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """float32 values (already scaled) -> E2M1 codes (int64, bit 3 the sign): the nearest
    representable value, ties to the even code, saturating at 6."""
    a = x.abs()
    # the thresholds between neighbouring values; at a midpoint the even code wins
    code = ((a > 0.25).long() + (a >= 0.75).long() + (a > 1.25).long() + (a >= 1.75).long()
            + (a > 2.5).long() + (a >= 3.5).long() + (a > 5.0).long())
    return code | ((x < 0) & (code > 0)).long() << 3


def e2m1_values(x: torch.Tensor) -> torch.Tensor:
    """The E2M1 value nearest to each of ``x`` (float32, already scaled), as
    ``E2M1_VALUES[e2m1_codes(x)]``, computed on the grid directly: steps of 0.5 below 2, of 1
    below 4, of 2 up to the saturation at 6 (``round`` breaks ties to even, which is the even
    code on each segment); a zero keeps the sign of ``x``."""
    a = x.abs()
    v = torch.where(a < 2, torch.round(a * 2) * 0.5,
                    torch.where(a < 4, torch.round(a), torch.round(a * 0.5) * 2))
    return torch.copysign(v.clamp(max=6.0), x)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] (K a multiple of 32) -> (packed E2M1 uint8 [M, K/2], UE8M0 exponents
    [M, K/32]). The OCP MX scale: ``2^(floor(log2 amax) - 2)`` (E2M1's largest exponent is 2),
    so a block's largest element lands in [4, 8) and saturates to 6 above it."""
    m, k = x.shape
    xg = x.to(torch.float32).reshape(m, k // MX_BLOCK, MX_BLOCK)
    amax = xg.abs().amax(-1)
    _, p = torch.frexp(amax)  # amax = f * 2^p, f in [0.5, 1): floor(log2 amax) = p - 1
    e = torch.where(amax > 0, p - 1 - 2, torch.full_like(p, -127)).clamp(-127, 127)
    e = (e + 127).to(torch.uint8)
    codes = e2m1_codes(xg / e8m0_to_float(e)[..., None]).reshape(m, k)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8), e


def dequant_mxfp4(packed: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 uint8 [N, K/2] and UE8M0 exponents [N, K/32] -> float32 [N, K]."""
    return dequant_e2m1(packed) * e8m0_to_float(e).repeat_interleave(MX_BLOCK, 1)


#: elements of one NVFP4 block (one e4m3 scale each)
NVFP4_BLOCK = 16


def fake_quant_nvfp4(x: torch.Tensor, per_row: bool) -> torch.Tensor:
    """The float32 values NVFP4 keeps of ``x`` [M, K] (K a multiple of 16): a global scale
    ``amax / (448 * 6)`` (per row when ``per_row``, as activations are quantized per token;
    else one for the tensor, as a weight), an e4m3 scale per block of 16 (the block's absolute
    maximum over 6, in units of the global scale), and E2M1 elements (nearest, ties to even,
    saturating at 6)."""
    xf = x.to(torch.float32)
    m, k = xf.shape
    amax = xf.abs().amax(-1, keepdim=True) if per_row else xf.abs().amax().reshape(1, 1)
    gs = (amax / (448.0 * 6.0)).clamp(min=1e-12)
    g = xf.reshape(m, k // NVFP4_BLOCK, NVFP4_BLOCK)
    bs = (g.abs().amax(-1) / 6.0 / gs).to(torch.float8_e4m3fn).to(torch.float32) * gs
    safe = torch.where(bs > 0, bs, torch.ones_like(bs))
    return (e2m1_values(g / safe[..., None]) * bs[..., None]).reshape(m, k)


def pack_int4_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Signed int4 codes [N, K] (in [-8, 7]) -> int8 [N, K/2], two per byte, the even column in
    the low nibble (two's complement nibbles)."""
    c = codes.to(torch.int32) & 0xF
    byte = c[:, 0::2] | (c[:, 1::2] << 4)
    return torch.where(byte >= 128, byte - 256, byte).to(torch.int8)


def unpack_int4_pairs(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4_pairs`: int32 codes [N, K] in [-8, 7]."""
    b = packed.to(torch.int32) & 0xFF
    lo, hi = b & 0xF, b >> 4
    c = torch.stack([lo, hi], -1).reshape(packed.shape[0], -1)
    return torch.where(c >= 8, c - 16, c)


def int4_channel_values(w: torch.Tensor) -> torch.Tensor:
    """The values a symmetric per-output-channel int4 quantization keeps of ``w`` [N, K]:
    ``q * s`` with ``s = amax / 7`` and ``q`` rounded to nearest even in [-8, 7]."""
    wf = w.to(torch.float32)
    s = (wf.abs().amax(-1, keepdim=True) / 7.0).clamp(min=1e-12)
    return torch.round(wf / s).clamp(-8, 7) * s


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric dynamic per-token int8: (int8 [M, K], float32 scales [M, 1]),
    ``x ~ q * scale`` with round-half-to-even."""
    xf = x.to(torch.float32)
    scale = xf.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127.0
    return torch.round(xf / scale).clamp(-128, 127).to(torch.int8), scale


def quantize_int8_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric static per-tensor int8 codes of ``x``."""
    return torch.round(x.to(torch.float32) / scale).clamp(-128, 127).to(torch.int8)
