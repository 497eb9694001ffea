"""Build (once, cached) and call the C kernels of ``kernels.c`` (Q4_0/Q4_1/Q8_0) and ``kquants.c``
(the K-quants Q2_K..Q6_K) through ctypes.

On a CPU with AVX512-VNNI the 8-bit-activation products of Q4_0/Q4_1/Q8_0 and Q4_K/Q5_K/Q6_K
read the weights in a *panel* form made once at load (:func:`panelize`: 16 rows' codes
interleaved so that one integer dot-product instruction serves 4 codes of 16 rows; kernels.c
and kquants.c say how): about the bytes of the GGUF rows, 2-4x fewer instructions a product
than the row-by-row kernels.

The shared library is compiled once by :func:`engine.api.native.load_library` (cached under the
engine cache directory, built for this CPU). It links OpenMP; inside a process that imported
torch it shares torch's own OpenMP runtime, so ``torch.set_num_threads`` sets its thread count
too.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from engine.api.native import load_library, weight_buffer

#: GGML type ids the kernels of kernels.c read (blocks of 32 values)
QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
#: GGML K-quant type ids the kernels of kquants.c read (super-blocks of 256 values; activations
#: always quantized to 8 bits per super-block, integer dot products)
KQTYPES = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
#: every type served packed
PACKED = {**QTYPES, **KQTYPES}
SOURCES = tuple(os.path.join(os.path.dirname(__file__), name)
                for name in ("kernels.c", "kquants.c", "panel_ops.h"))
KQ_IDS = frozenset(KQTYPES.values())
#: bytes of one 32-value block of each type id of kernels.c
_BLOCK_BYTES = {2: 18, 3: 20, 8: 34}
#: bytes of one 256-value super-block of each K-quant type id
_KQ_BLOCK_BYTES = {10: 84, 11: 110, 12: 144, 13: 176, 14: 210}
#: type ids that have a panel form (where the CPU has the panel kernels: :func:`panel_path`)
PANEL_TYPES = frozenset(QTYPES.values()) | frozenset(KQTYPES[t] for t in ("Q4_K", "Q5_K",
                                                                          "Q6_K"))


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded kernel library (built on first call, see :mod:`engine.api.native`)."""
    lib = load_library("gguf", SOURCES, ("-std=c11",))
    fn = lib.engine_gguf_matmul
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    lib.engine_gguf_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_int64, ctypes.c_void_p]
    lib.engine_gguf_dequantize.restype = ctypes.c_int
    lib.engine_gguf_matmul_q8.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                          ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                          ctypes.c_void_p, ctypes.c_int64]
    lib.engine_gguf_matmul_q8.restype = ctypes.c_int
    for name in ("engine_gguf_panel_q8", "engine_gguf_panel_q16"):
        getattr(lib, name).argtypes = lib.engine_gguf_matmul_q8.argtypes
        getattr(lib, name).restype = ctypes.c_int
    lib.engine_gguf_panel_bytes.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    lib.engine_gguf_panel_bytes.restype = ctypes.c_int64
    lib.engine_gguf_panel_path.argtypes = []
    lib.engine_gguf_panel_path.restype = ctypes.c_int
    lib.engine_gguf_repack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.engine_gguf_repack.restype = ctypes.c_int
    lib.engine_gguf_kq_panel_q8.argtypes = lib.engine_gguf_matmul_q8.argtypes
    lib.engine_gguf_kq_panel_q8.restype = ctypes.c_int
    return declare_kquants(lib)


def panel_path() -> bool:
    """Whether 8-bit-activation products of :data:`PANEL_TYPES` run from the panel form: the
    library has the panel kernels (AVX512-VNNI) and ``ENGINE_GGUF_PANELS`` is not ``0``."""
    lib = library()
    return os.environ.get("ENGINE_GGUF_PANELS", "1") != "0" and \
        lib.engine_gguf_panel_path() == 1 and lib.engine_gguf_panel_bytes(12, 16, 256) > 0


def _row_bytes(qtype: int, k: int) -> int:
    """Bytes of one GGUF row of ``k`` values of ``qtype`` (0 for a type the kernels lack)."""
    if qtype in KQ_IDS:
        return k // 256 * _KQ_BLOCK_BYTES[qtype]
    return k // 32 * _BLOCK_BYTES.get(qtype, 0)


def panelize(qtype: int, blocks: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The panel form (uint8 [ceil(n / 16), bytes a panel]) of the GGUF blocks ``blocks`` [n, k]
    of ``qtype`` (one of :data:`PANEL_TYPES`; needs :func:`panel_path`)."""
    lib = library()
    size = lib.engine_gguf_panel_bytes(qtype, n, k)
    if size <= 0 or not blocks.is_contiguous() or blocks.numel() != n * _row_bytes(qtype, k):
        raise ValueError(f"gguf kernel: no panel form for type {qtype} [{n}, {k}]")
    out = weight_buffer(((n + 15) // 16, size // ((n + 15) // 16)))  # (streamed every step)
    rc = lib.engine_gguf_repack(qtype, blocks.data_ptr(), n, k, out.data_ptr(), 1)
    if rc != 0:
        raise ValueError(f"gguf kernel: no panel form for type {qtype} [{n}, {k}]")
    return out


def unpanelize(qtype: int, panels: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The GGUF blocks [n, row bytes] back from :func:`panelize`'s form (the same bytes)."""
    out = torch.empty((n, _row_bytes(qtype, k)), dtype=torch.uint8)
    rc = library().engine_gguf_repack(qtype, out.data_ptr(), n, k, panels.data_ptr(), 0)
    if rc != 0:
        raise ValueError(f"gguf kernel: no panel form for type {qtype} [{n}, {k}]")
    return out


def declare_kquants(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of kquants.c's functions on ``lib``; returns it.
    ``engine_gguf_kq_matmul_ld`` takes the arguments of ``engine_gguf_matmul_q8``."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for name, argtypes in (
            ("engine_gguf_kq_matmul", [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr]),
            ("engine_gguf_kq_matmul_ld", [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, i64]),
            ("engine_gguf_kq_dequantize", [ctypes.c_int, ptr, i64, i64, ptr]),
            ("engine_gguf_kq_path", [])):
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def matmul(qtype: int, blocks: torch.Tensor, n: int, x: torch.Tensor,
           out: torch.Tensor | None = None, panels: bool = False) -> torch.Tensor:
    """``x`` float32 [M, K] (contiguous) @ the packed weight [n, K]^T -> float32 [M, n].

    ``blocks`` is the uint8 [n, row_bytes] GGUF layout of type ``qtype`` (a value of PACKED;
    K-quants quantize the activations to 8 bits, see :func:`matmul_q8`). ``out``: a float32
    [M, n] tensor to write into and return, whose rows may be strided (a column slice of a
    wider output). The call releases the GIL while it runs. ``panels``: ``blocks`` is
    :func:`panelize`'s form (K-quants only: the other types' float32 kernel reads GGUF rows).
    """
    if qtype in KQ_IDS:
        return _kq_matmul(qtype, blocks, n, x, out, panels)
    if panels:
        raise ValueError("gguf kernel: the float32 kernel reads GGUF rows, not panels")
    if out is not None:
        return out.copy_(matmul(qtype, blocks, n, x))
    m, k = x.shape
    y = torch.empty((m, n), dtype=torch.float32)
    rc = library().engine_gguf_matmul(qtype, blocks.data_ptr(), n, k, x.data_ptr(), m,
                                      y.data_ptr())
    if rc != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k}; K must be a "
                         "multiple of 32)")
    return y


def matmul_q8(qtype: int, blocks: torch.Tensor, n: int, x: torch.Tensor,
              out: torch.Tensor | None = None, panels: bool = False) -> torch.Tensor:
    """As :func:`matmul`, with the activations quantized per block of 32 to int8 and integer
    block dot products (llama.cpp's arithmetic; K-quants: per super-block of 256 values, see
    kquants.c). ``out``: a float32 [M, >=n] view whose rows are contiguous (e.g. a column slice
    of a wider output) to write into. ``panels``: ``blocks`` is :func:`panelize`'s form."""
    if qtype in KQ_IDS:
        return _kq_matmul(qtype, blocks, n, x, out, panels)
    m, k = x.shape
    y = torch.empty((m, n), dtype=torch.float32) if out is None else out
    if y.stride(-1) != 1 or y.shape[0] != m or y.shape[1] != n:
        raise ValueError("gguf kernel: out must be [M, n] with contiguous rows")
    if panels:
        _check_panels(qtype, blocks, n, k)
    fn = library().engine_gguf_panel_q8 if panels else library().engine_gguf_matmul_q8
    rc = fn(qtype, blocks.data_ptr(), n, k, x.data_ptr(), m, y.data_ptr(), y.stride(0))
    if rc != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k}; K must be a "
                         "multiple of 32)")
    return y


def matmul_q16(qtype: int, panels: torch.Tensor, n: int, x: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """As :func:`matmul_q8` from the panel form of a Q4_0/Q4_1/Q8_0 weight, with the activations
    quantized per block of 32 to int16 (their rounding ~1e-5 of a block's largest value, where
    int8's is ~4e-3): the logits head of a model served with 8-bit activations."""
    m, k = x.shape
    if qtype in KQ_IDS or qtype not in PANEL_TYPES:
        raise ValueError(f"gguf kernel: no 16-bit product for type {qtype}")
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("gguf kernel: x must be contiguous float32")
    _check_panels(qtype, panels, n, k)
    y = torch.empty((m, n), dtype=torch.float32) if out is None else out
    if y.stride(-1) != 1 or y.shape[0] != m or y.shape[1] != n:
        raise ValueError("gguf kernel: out must be [M, n] with contiguous rows")
    rc = library().engine_gguf_panel_q16(qtype, panels.data_ptr(), n, k, x.data_ptr(), m,
                                         y.data_ptr(), y.stride(0))
    if rc != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k}; K must be a "
                         "multiple of 32)")
    return y


def _check_panels(qtype: int, panels: torch.Tensor, n: int, k: int) -> None:
    """The panel kernels read the panel form of an [n, k] weight: refuse any other buffer."""
    size = library().engine_gguf_panel_bytes(qtype, n, k)
    if not panels.is_contiguous() or panels.numel() != size:
        raise ValueError(f"gguf kernel: {panels.numel()} bytes are not the panel form of a "
                         f"[{n}, {k}] weight of type {qtype}")


def _check_kq_blocks(qtype: int, blocks: torch.Tensor, n: int, k: int) -> None:
    """The kernels read ``n`` rows of ``k // 256`` blocks: refuse any other buffer."""
    if not blocks.is_contiguous() or blocks.numel() != n * (k // 256) * _KQ_BLOCK_BYTES[qtype]:
        raise ValueError(f"gguf kernel: {blocks.numel()} bytes of blocks for a [{n}, {k}] weight "
                         f"of type {qtype} (K must be a multiple of 256)")


def _kq_matmul(qtype: int, blocks: torch.Tensor, n: int, x: torch.Tensor,
               out: torch.Tensor | None, panels: bool = False) -> torch.Tensor:
    m, k = x.shape
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("gguf kernel: x must be contiguous float32")
    if panels:
        _check_panels(qtype, blocks, n, k)
    else:
        _check_kq_blocks(qtype, blocks, n, k)
    y = torch.empty((m, n), dtype=torch.float32) if out is None else out
    if y.shape != (m, n) or y.dtype != torch.float32 or (n > 1 and y.stride(1) != 1):
        raise ValueError(f"gguf kernel: out must be float32 [{m}, {n}] with contiguous rows")
    ldy = y.stride(0) if m > 1 else n
    fn = library().engine_gguf_kq_panel_q8 if panels else library().engine_gguf_kq_matmul_ld
    rc = fn(qtype, blocks.data_ptr(), n, k, x.data_ptr(), m, y.data_ptr(), ldy)
    if rc != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k}; K must be a "
                         "multiple of 256)")
    return y


def dequantize(qtype: int, blocks: torch.Tensor, n: int, k: int,
               panels: bool = False) -> torch.Tensor:
    """float32 [n, k] values of the packed weight, bit-identical to the gguf package's
    (``panels``: ``blocks`` is :func:`panelize`'s form)."""
    if panels:
        blocks = unpanelize(qtype, blocks, n, k)
    out = torch.empty((n, k), dtype=torch.float32)
    if qtype in KQ_IDS:
        _check_kq_blocks(qtype, blocks, n, k)
        rc = library().engine_gguf_kq_dequantize(qtype, blocks.data_ptr(), n, k, out.data_ptr())
        if rc != 0:
            raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k}; K must be a "
                             "multiple of 256)")
        return out
    if library().engine_gguf_dequantize(qtype, blocks.data_ptr(), n, k, out.data_ptr()) != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k})")
    return out
