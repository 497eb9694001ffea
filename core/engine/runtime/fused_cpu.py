"""The fused per-layer operations of :mod:`engine.runtime.fused`, for float32 tensors on the CPU.

Same functions, same contracts (``add_rms_norm``, ``qk_norm_rope``, ``silu_and_mul``), as C
kernels (``fused_cpu.c``, built once by :mod:`engine.api.native`); plus ``decode_attention``,
which reads K/V straight from the paged pool through ``req_to_token`` (no gather), for the CPU
attention paths. Each is one call and one pass over its rows, where the torch ops they replace
are several calls with temporaries; at batch 1 that overhead is most of a small model's step.

Arithmetic is float32 throughout, in a fixed order per row (batch-invariant); results equal the
torch ops' up to summation order. Unavailable (``available()`` is false: the torch ops serve)
without a C compiler or AVX2/FMA, or with ``ENGINE_DISABLE_FUSED=1``.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Callable

import torch

_SOURCE = os.path.join(os.path.dirname(__file__), "fused_cpu.c")
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    from engine.api.native import load_library
    from engine.errors import PluginError
    from engine.plugins.platform import facts

    if not {"avx2", "fma"} <= facts().cpu_features:
        return None
    try:
        lib = load_library("fused_cpu", (_SOURCE,), ("-std=c11",))
    except PluginError:
        return None
    lib.engine_cpu_add_rms_norm.argtypes = [_P, _I, _P, _I, _P, _P, _P, _I, _I, _F]
    lib.engine_cpu_qk_norm_rope.argtypes = [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _F]
    lib.engine_cpu_silu_and_mul.argtypes = [_P, _I, _P, _I, _I, _I]
    lib.engine_cpu_decode_attention.argtypes = [_P, _P, _P, _P, _I, _P, _P, _P, _I, _I, _I,
                                                _I, _F, _I, _I, _F]
    lib.engine_cpu_decode_attention_fp4.argtypes = [_P, _P, _P, _P, _I, _P, _P, _P, _I, _I, _I,
                                                    _I, _F, _I]
    for fn in (lib.engine_cpu_add_rms_norm, lib.engine_cpu_qk_norm_rope,
               lib.engine_cpu_silu_and_mul, lib.engine_cpu_decode_attention,
               lib.engine_cpu_decode_attention_fp4):
        fn.restype = None
    lib.engine_cpu_decode_layers.argtypes = [_P, _I, _I, _I, _I, _I, _I, _I, _F, _F, _P, _P, _P,
                                             _P, _P, _I, _P, _P, _I, _I, _P, _P, _P, _P, _I,
                                             _I, _P]
    lib.engine_cpu_decode_layers.restype = ctypes.c_int
    lib.engine_cpu_fake_quant_fp8.argtypes = [_P, _P, _I, _I, _I, _F, _F, _I, _I]
    lib.engine_cpu_fake_quant_fp8.restype = None
    lib.engine_cpu_fake_quant_nvfp4_rows.argtypes = [_P, _P, _I, _I]
    lib.engine_cpu_fake_quant_nvfp4_rows.restype = None
    lib.engine_cpu_gemv_f32.argtypes = [_P, _I, _I, _P, _I, _I, _P, _P, _I]
    lib.engine_cpu_gemv_f32.restype = None
    lib.engine_cpu_gemv_half.argtypes = [_P, _I, _I, _I, _P, _I, _I, _P, _P, _I]
    lib.engine_cpu_gemv_half.restype = None
    lib.engine_cpu_affine_f32.argtypes = [_P, _I, _P, _P, _I, _I, _I, _P, _I, _I, _P, _P, _I]
    lib.engine_cpu_affine_f32.restype = ctypes.c_int
    lib.engine_cpu_fq_gemv_f32.argtypes = [_P, _I, _I, _P, _I, _P, _P, _I, _F, _F, _I, _I]
    lib.engine_cpu_fq_gemv_f32.restype = None
    for name in ("engine_cpu_dense_mm", "engine_cpu_affine_mm"):  # (decode-plan matmuls)
        getattr(lib, name).restype = ctypes.c_int
    lib.engine_cpu_moe_f32.argtypes = [_P, _I, _I, _P, _P, _P, _I, _P, _P, _P, _P, _P,
                                       ctypes.c_int, _I]
    lib.engine_cpu_moe_f32.restype = None
    lib.engine_cpu_moe_routed_f32.argtypes = [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P,
                                              _P, _P, _P, _P, _I]
    lib.engine_cpu_moe_routed_f32.restype = None
    return lib


def address(name: str) -> int:
    """The address of the library's C function ``name`` (a decode plan's matmul)."""
    return ctypes.cast(getattr(_library(), name), ctypes.c_void_p).value


def available() -> bool:
    """Whether the kernels can run here (built on first call)."""
    return os.environ.get("ENGINE_DISABLE_FUSED") != "1" and _library() is not None


def enabled(x: torch.Tensor) -> bool:
    """Whether these kernels serve ``x``: a float32 CPU tensor, kernels available."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and available()


def _rows_ok(x: torch.Tensor) -> bool:
    return x.dim() == 2 and x.stride(1) == 1


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual) for rows of ``x`` [T, N] (new tensors);
    without a residual, (rms_norm(x) * weight, x)."""
    x = x if _rows_ok(x) else x.contiguous()
    t, n = x.shape
    out = torch.empty((t, n), dtype=torch.float32)
    res_out = x
    if residual is not None:
        residual = residual if _rows_ok(residual) else residual.contiguous()
        res_out = torch.empty((t, n), dtype=torch.float32)
    _library().engine_cpu_add_rms_norm(
        x.data_ptr(), x.stride(0), residual.data_ptr() if residual is not None else None,
        residual.stride(0) if residual is not None else 0, res_out.data_ptr(),
        weight.data_ptr(), out.data_ptr(), t, n, eps)
    return out, res_out


def qk_norm_rope(qk: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D] and k [T, Hkv, D]: views of the q and k columns at the start of each row of
    ``qk`` (the fused qkv projection's output, rotated in place), each head RMS-normalised with
    its weight (when given) and rotated by RoPE at ``positions``."""
    if not _rows_ok(qk):
        raise ValueError("qk_norm_rope: qk must have contiguous rows")
    t = qk.shape[0]
    pos = positions if positions.dtype == torch.int64 else positions.long()
    pos = pos.contiguous()
    _library().engine_cpu_qk_norm_rope(
        qk.data_ptr(), qk.stride(0), t, num_q_heads, num_kv_heads, head_dim, pos.data_ptr(),
        cos_cache.data_ptr(), sin_cache.data_ptr(),
        q_weight.data_ptr() if q_weight is not None else None,
        k_weight.data_ptr() if k_weight is not None else None, eps)
    q_size, k_size = num_q_heads * head_dim, num_kv_heads * head_dim
    q = qk[:, :q_size].view(t, num_q_heads, head_dim)
    k = qk[:, q_size:q_size + k_size].view(t, num_kv_heads, head_dim)
    return q, k


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x`` [T, 2I]."""
    x = x if _rows_ok(x) else x.contiguous()
    t, two_i = x.shape
    out = torch.empty((t, two_i // 2), dtype=torch.float32)
    _library().engine_cpu_silu_and_mul(x.data_ptr(), x.stride(0), out.data_ptr(),
                                       out.stride(0), t, two_i // 2)
    return out


#: the pool storage types the kernels read and the plan writes, by the C code's numbering
KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: the storage types :func:`decode_attention` reads: those, and fp8 (values times 2^-8 for
#: e4m3fn, as they are for e5m2: :data:`FP8_READ_UNIT`)
READ_TYPES = {**KV_TYPES, torch.float8_e4m3fn: 3, torch.float8_e5m2: 4}
FP8_READ_UNIT = {torch.float8_e4m3fn: 256.0, torch.float8_e5m2: 1.0}


def _pool_attention(fn: Any, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                    seq_lens: torch.Tensor, head_dim: int, scale: float, max_len: int,
                    *tail: Any) -> torch.Tensor:
    """Call one of the C pool-attention kernels ``fn`` (arguments as both take them; ``tail``:
    the kernel's own last ones) and return its output, shaped as ``q``."""
    q = q.contiguous()
    b, hq, _ = q.shape
    out = torch.empty_like(q)
    idx = req_pool_indices.contiguous()
    lens = seq_lens.contiguous()
    fn(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), req_to_token.data_ptr(),
       req_to_token.stride(0), idx.data_ptr(), lens.data_ptr(), out.data_ptr(), b, hq,
       k_pool.shape[1], head_dim, scale, max_len, *tail)
    return out


def decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                     req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     seq_lens: torch.Tensor, max_len: int, scale: float, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    """One query token per request: float32 ``q`` [B, Hq, D] attends to the ``seq_lens[b]``
    slots ``req_to_token[req_pool_indices[b]]`` of the pools [slots, Hkv, D] (float32, float16,
    bfloat16 or fp8 with the layer's ``k_scale`` / ``v_scale``: :data:`READ_TYPES`; GQA: query
    head h reads KV head h // (Hq / Hkv)). ``max_len``: the largest of ``seq_lens``."""
    unit = FP8_READ_UNIT.get(k_pool.dtype, 1.0)
    return _pool_attention(_library().engine_cpu_decode_attention, q, k_pool, v_pool,
                           req_to_token, req_pool_indices, seq_lens, q.shape[2],
                           scale * k_scale * unit, max_len, READ_TYPES[k_pool.dtype],
                           v_scale * unit)


def decode_attention_fp4(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                         req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                         seq_lens: torch.Tensor, max_len: int, scale: float,
                         head_dim: int) -> torch.Tensor:
    """:func:`decode_attention` over ``fp4_mx_block16`` pools (uint8 [slots, Hkv, head_dim / 2
    + head_dim / 16]: :mod:`engine.runtime.kv_fp4`), each row unpacked exactly as it is read."""
    return _pool_attention(_library().engine_cpu_decode_attention_fp4, q, k_pool, v_pool,
                           req_to_token, req_pool_indices, seq_lens, head_dim, scale, max_len)


#: fp8 formats: (largest finite value, mantissa bits, exponent of the smallest normal)
_FP8 = {torch.float8_e4m3fn: (448.0, 3, -6), torch.float8_e5m2: (57344.0, 2, -14)}


#: products of at most this many rows stream the weights (:func:`gemv`); beyond it the dot
#: products (one per output and row) cost more than a general matrix product
GEMV_ROWS = 12
#: weights of fewer floats (a router) cost less through torch than the call into C
GEMV_MIN_FLOATS = 1 << 17


#: weight storage types :func:`gemv` reads (16-bit weights widened exactly as they are read)
WEIGHT_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`gemv` serves ``x @ weight.T``: float32 CPU rows, a contiguous 2-D weight
    (float32, or a 16-bit type of :data:`WEIGHT_TYPES`) of at least :data:`GEMV_MIN_FLOATS`,
    at most :data:`GEMV_ROWS` rows of ``x``."""
    return (x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype in WEIGHT_TYPES and weight.dim() == 2
            and x.shape[-1] == weight.shape[1] and 0 < x.numel() <= GEMV_ROWS * x.shape[-1]
            and weight.numel() >= GEMV_MIN_FLOATS and weight.is_contiguous() and available())


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a few rows (:func:`gemv_applies`), reading each weight
    row once for all of them. Each output is one dot product (its own order of additions:
    equal to torch's within float32 rounding, not bit for bit). A 16-bit weight gives its
    float32 copy's result bit for bit, reading half the bytes."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    n, k = weight.shape
    out = torch.empty(flat.shape[0], n, dtype=torch.float32)
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    args = (n, k, flat.data_ptr(), flat.stride(0), flat.shape[0],
            bias.data_ptr() if bias is not None else None, out.data_ptr(), n)
    if weight.dtype == torch.float32:
        _library().engine_cpu_gemv_f32(weight.data_ptr(), *args)
    else:
        _library().engine_cpu_gemv_half(weight.data_ptr(), WEIGHT_TYPES[weight.dtype], *args)
    return out.reshape(*x.shape[:-1], n)


def affine(x: torch.Tensor, codes: torch.Tensor, bits: int, scale: torch.Tensor,
           bias_: torch.Tensor, group: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` float32 [..., K] @ W^T for a ``bits``-bit (4 or 8) affine weight ``W[r, c] =
    q[r, c] * scale[r, g] + bias_[r, g]`` (``g = c // group``, group a multiple of 32): 8-bit
    ``codes`` uint8 [N, K]; 4-bit uint8 [N, K / 2] in 32-column blocks (byte j: column j in
    the low nibble, column j + 16 in the high one); ``scale``/``bias_`` float32 [N, K / group];
    all contiguous. Each weight row is read once for all rows of x; a row's result does not
    depend on the others (its own fixed order of additions: equal to the dequantized weight's
    product within float32 rounding)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    n, k = codes.shape[0], flat.shape[1]
    out = torch.empty(flat.shape[0], n, dtype=torch.float32)
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    rc = _library().engine_cpu_affine_f32(codes.data_ptr(), bits, scale.data_ptr(),
                                          bias_.data_ptr(), n, k, group, flat.data_ptr(),
                                          flat.stride(0), flat.shape[0],
                                          bias.data_ptr() if bias is not None else None,
                                          out.data_ptr(), n)
    if rc != 0:
        raise MemoryError("fused_cpu.affine: no scratch memory for the rows' group sums")
    return out.reshape(*x.shape[:-1], n)


def _experts_apply(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether the expert kernels serve these: float32 CPU rows, contiguous CPU weights of one
    type of :data:`WEIGHT_TYPES` (16-bit ones widened exactly as they are read)."""
    return (enabled(x) and w13.dtype in WEIGHT_TYPES and w2.dtype == w13.dtype
            and w13.device.type == "cpu" and w13.is_contiguous() and w2.is_contiguous())


def moe_experts(x: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                round_mid: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> torch.Tensor | None:
    """The routed experts' products for rows sorted by expert, in one call: ``x`` [P, hidden]
    float32, ``counts`` [E] rows per expert (in order), ``w13`` [E, 2 * inter, hidden] (gate
    then up), ``w2`` [E, hidden, inter]; returns ``silu(gate) * up @ w2[e]^T`` per row
    [P, hidden]. Only experts with rows are read, each weight row once for all of its rows.
    ``round_mid`` (an activation format's rounding of the down projection's inputs) splits it
    into two calls with the rounding between. Each output is one dot product (equal to
    torch's within float32 rounding). None where it does not apply (not float32 CPU contiguous
    tensors, or no kernels)."""
    if not _experts_apply(x, w13, w2):
        return None
    x = x.contiguous()
    hidden, inter = x.shape[1], w2.shape[2]
    counts = counts.to(torch.int64)
    eid = torch.nonzero(counts).reshape(-1)
    n = counts[eid].contiguous()
    start = (torch.cumsum(n, 0) - n).contiguous()
    rows = x.shape[0]
    gu = torch.empty(rows, 2 * inter, dtype=torch.float32)
    mid = torch.empty(rows, inter, dtype=torch.float32)
    y = torch.empty(rows, hidden, dtype=torch.float32)

    def call(mid: torch.Tensor, phases: int) -> None:
        _library().engine_cpu_moe_f32(x.data_ptr(), hidden, inter, eid.data_ptr(),
                                      start.data_ptr(), n.data_ptr(), eid.numel(),
                                      w13.data_ptr(), w2.data_ptr(), gu.data_ptr(),
                                      mid.data_ptr(), y.data_ptr(), phases,
                                      WEIGHT_TYPES[w13.dtype])
    if round_mid is None:
        call(mid, 3)
    else:
        call(mid, 1)
        call(round_mid(mid).to(torch.float32).contiguous(), 2)
    return y


def moe_routed(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
               w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor | None:
    """A routed-experts layer from the router's choice in one call: ``x`` [T, hidden] float32,
    ``topk_ids`` [T, k] (ids outside ``0..E-1``: not this rank's, they add nothing),
    ``topk_weights`` [T, k]; returns ``sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` [T, hidden]
    (float32, the slots added in order). The pairs are sorted by expert in C and
    :func:`moe_experts`'s product runs them; no torch op runs in between. None where it does not
    apply (as :func:`moe_experts`)."""
    if not _experts_apply(x, w13, w2):
        return None
    x = x.contiguous()
    t, k = topk_ids.shape
    e, _, hidden = w13.shape
    inter = w2.shape[2]
    ids = topk_ids.to(torch.int64).contiguous()
    tw = topk_weights.to(torch.float32).contiguous()
    pairs = t * k
    xs = torch.empty(pairs, hidden, dtype=torch.float32)
    gu = torch.empty(pairs, 2 * inter, dtype=torch.float32)
    mid = torch.empty(pairs, inter, dtype=torch.float32)
    y = torch.empty(pairs, hidden, dtype=torch.float32)
    ints = torch.empty(4 * e + 2 * pairs, dtype=torch.int64)
    out = torch.empty(t, hidden, dtype=torch.float32)
    _library().engine_cpu_moe_routed_f32(
        x.data_ptr(), t, k, hidden, inter, e, ids.data_ptr(), tw.data_ptr(), w13.data_ptr(),
        w2.data_ptr(), xs.data_ptr(), gu.data_ptr(), mid.data_ptr(), y.data_ptr(),
        ints.data_ptr(), out.data_ptr(), WEIGHT_TYPES[w13.dtype])
    return out


def _static_scale(scale: torch.Tensor | None) -> float | None:
    """The kernels' static activation scale: 0.0 for dynamic (``scale`` None), the one
    positive value of ``scale``, or None where the kernels do not apply."""
    if scale is None:
        return 0.0
    if scale.numel() != 1:
        return None
    static = float(scale.reshape(()).item())
    return static if static > 0.0 else None


def fake_quant_fp8(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None,
                   group: int | None = None) -> torch.Tensor | None:
    """:func:`engine.runtime.quant_formats.fake_quant_fp8` for a contiguous float32 CPU
    ``x`` [M, K] in one call (bit-identical); None where it does not apply (another format,
    layout, or no kernels)."""
    if dtype not in _FP8 or x.dtype != torch.float32 or x.dim() != 2 or \
            not x.is_contiguous() or x.device.type != "cpu" or not available():
        return None
    static = _static_scale(scale)
    if static is None:
        return None
    fmax, mbits, emin = _FP8[dtype]
    out = torch.empty_like(x)
    _library().engine_cpu_fake_quant_fp8(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                                         group or 0, static, fmax, mbits, emin)
    return out


def fake_quant_nvfp4_rows(x: torch.Tensor) -> torch.Tensor | None:
    """:func:`engine.runtime.quant_formats.fake_quant_nvfp4` with a global scale per row, for a
    contiguous float32 CPU ``x`` [M, K] (K a multiple of 16), in one call (bit-identical); None
    where it does not apply."""
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() or \
            x.device.type != "cpu" or x.shape[1] % 16 or not available():
        return None
    out = torch.empty_like(x)
    _library().engine_cpu_fake_quant_nvfp4_rows(x.data_ptr(), out.data_ptr(), x.shape[0],
                                                x.shape[1])
    return out


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               dtype: torch.dtype, scale: torch.Tensor | None = None,
               group: int | None = None) -> torch.Tensor | None:
    """``gemv(fake_quant_fp8(x, dtype, scale, group), weight, bias)`` in one call for a
    contiguous float32 ``x`` [M, K] of a few rows (bit-identical to the two); None where either
    does not apply."""
    if dtype not in _FP8 or x.dim() != 2 or not x.is_contiguous() or \
            not gemv_applies(x, weight):
        return None
    static = _static_scale(scale)
    if static is None:
        return None
    fmax, mbits, emin = _FP8[dtype]
    n, k = weight.shape
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    _library().engine_cpu_fq_gemv_f32(weight.data_ptr(), n, k, x.data_ptr(), x.shape[0],
                                      bias.data_ptr() if bias is not None else None,
                                      out.data_ptr(), group or 0, static, fmax, mbits, emin)
    return out


#: int64 fields per layer of a decode plan (see ``engine_cpu_decode_layers`` in fused_cpu.c)
PLAN_FIELDS = 22


class DecodePlan:
    """A decode forward through all decoder layers as one C call: the CPU counterpart of a
    captured CUDA graph. Built once per model and pool from the layers' parameters and each
    linear layer's native kernel (:meth:`QuantMethod.native_kernel`); the kernels and their
    order are those of the per-operation path, so results are bit-identical to it.

    ``layers``: (input norm weight, post-attention norm weight, q norm weight or None, k norm
    weight or None, (qkv, o, gate_up, down) native kernels
    (:class:`~engine.runtime.linear.NativeKernel`), their float32 biases (None: none), K pool,
    V pool) per layer. ``head``: (the final norm's float32 weight, the logits head's native
    kernel, its float32 bias or None, the vocabulary) to compute the logits in the same call
    (None: the caller does). ``max_rows``: the largest batch every kernel serves
    bit-identically (None: any). ``modules``: the layers whose products the kernels compute
    (see :meth:`serves`).
    """

    def __init__(self, layers: list[tuple], *, hidden: int, num_q_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate: int, eps: float, cos_cache: torch.Tensor,
                 sin_cache: torch.Tensor, modules: tuple[torch.nn.Module, ...] = (),
                 head: tuple | None = None) -> None:
        rows = []
        for in_w, post_w, qn, kn, kernels, biases, k_pool, v_pool in layers:
            row = [in_w.data_ptr(), post_w.data_ptr(), qn.data_ptr() if qn is not None else 0,
                   kn.data_ptr() if kn is not None else 0]
            for (fn, qtype, weight, *_), bias in zip(kernels, biases):
                row += [fn, qtype, weight, bias.data_ptr() if bias is not None else 0]
            rows.append(row + [k_pool.data_ptr(), v_pool.data_ptr()])
        bounds = [k[3] for *_, kernels, _, _, _ in layers for k in kernels
                  if len(k) > 3 and k[3] is not None]
        self.max_rows = min(bounds) if bounds else None
        #: the head's bound (:meth:`head_serves`)
        self.head, self._head_fields, self.head_rows = head, None, None
        if head is not None:
            _, (fn, qtype, weight, *rest), bias, _ = head
            self.head_rows = rest[0] if rest else None
            self._head_fields = torch.tensor(
                [fn, qtype, weight, bias.data_ptr() if bias is not None else 0],
                dtype=torch.int64)
        self.plan = torch.tensor(rows, dtype=torch.int64)
        assert self.plan.shape[1] == PLAN_FIELDS
        self._layers = layers  # the tensors whose addresses the plan holds stay alive with it
        self.kv_type = KV_TYPES[layers[0][6].dtype] if layers else 0
        self.dims = (len(layers), hidden, num_q_heads, num_kv_heads, head_dim, intermediate)
        self.eps, self.scale = eps, head_dim ** -0.5
        self.cos, self.sin = cos_cache, sin_cache
        self.modules = modules

    def serves(self, rows: int) -> bool:
        """Whether the plan computes a decode of ``rows`` requests as the per-operation path
        would: within :attr:`max_rows`, and none of ``modules`` (the layers whose products the
        plan replaces) has forward hooks (a LoRA adapter's deltas) at this forward."""
        if self.max_rows is not None and rows > self.max_rows:
            return False
        return not any(m._forward_hooks or m._forward_pre_hooks for m in self.modules)

    def head_serves(self, rows: int) -> bool:
        """Whether :meth:`run` can give the logits of ``rows`` rows (a head, within its
        kernel's bound; the caller multiplies the head otherwise)."""
        return self.head is not None and (self.head_rows is None or rows <= self.head_rows)

    def run(self, h: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor,
            req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
            max_len: int, logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """``h`` [B, hidden] embeddings of one token per request -> the last layer's output
        plus the residual (a new tensor), writing each layer's K/V at ``out_cache_loc``. With
        ``logits_rows`` (row indices) where :meth:`head_serves` the batch: the logits of those
        rows [len(logits_rows), vocab] instead, the final norm and the head in the same call."""
        h = h.contiguous().clone()
        n, hidden, hq, hk, d, inter = self.dims
        pos, loc = positions.contiguous(), out_cache_loc.contiguous()
        idx, lens = req_pool_indices.contiguous(), seq_lens.contiguous()
        head = self.head if logits_rows is not None and self.head_serves(h.shape[0]) else None
        logits = rows = None
        if head is not None:
            rows = logits_rows.to(torch.int64).contiguous()
            logits = torch.empty((rows.numel(), head[3]), dtype=torch.float32)
        rc = _library().engine_cpu_decode_layers(
            self.plan.data_ptr(), n, h.shape[0], hidden, hq, hk, d, inter, self.eps, self.scale,
            self.cos.data_ptr(), self.sin.data_ptr(), pos.data_ptr(), loc.data_ptr(),
            req_to_token.data_ptr(), req_to_token.stride(0), idx.data_ptr(), lens.data_ptr(),
            max_len, self.kv_type, h.data_ptr(),
            self._head_fields.data_ptr() if head else None, head[0].data_ptr() if head else None,
            rows.data_ptr() if head else None, rows.numel() if head else 0,
            head[3] if head else 0, logits.data_ptr() if head else None)
        if rc != 0:
            raise RuntimeError(f"CPU decode plan: a kernel failed ({rc})")
        return logits if head is not None else h
