"""Build (once, cached) and call the C kernels of ``kernels.c`` through ctypes.

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

from engine.api.native import load_library

#: GGML type ids the kernels read
QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
SOURCES = (os.path.join(os.path.dirname(__file__), "kernels.c"),)


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
    return lib


def matmul(qtype: int, blocks: torch.Tensor, n: int, x: torch.Tensor) -> torch.Tensor:
    """``x`` float32 [M, K] (contiguous) @ the packed weight [n, K]^T -> float32 [M, n].

    ``blocks`` is the uint8 [n, row_bytes] GGUF layout of type ``qtype`` (a value of QTYPES).
    The call releases the GIL while it runs.
    """
    m, k = x.shape
    y = torch.empty((m, n), dtype=torch.float32)
    rc = library().engine_gguf_matmul(qtype, blocks.data_ptr(), n, k, x.data_ptr(), m,
                                      y.data_ptr())
    if rc != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k}; K must be a "
                         "multiple of 32)")
    return y


def matmul_q8(qtype: int, blocks: torch.Tensor, n: int, x: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """As :func:`matmul`, with the activations quantized per block of 32 to int8 and integer
    block dot products (llama.cpp's arithmetic). ``out``: a float32 [M, >=n] view whose rows
    are contiguous (e.g. a column slice of a wider output) to write into."""
    m, k = x.shape
    y = torch.empty((m, n), dtype=torch.float32) if out is None else out
    if y.stride(-1) != 1 or y.shape[0] != m or y.shape[1] != n:
        raise ValueError("gguf kernel: out must be [M, n] with contiguous rows")
    rc = library().engine_gguf_matmul_q8(qtype, blocks.data_ptr(), n, k, x.data_ptr(), m,
                                         y.data_ptr(), y.stride(0))
    if rc != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k}; K must be a "
                         "multiple of 32)")
    return y


def dequantize(qtype: int, blocks: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """float32 [n, k] values of the packed weight, bit-identical to the gguf package's."""
    out = torch.empty((n, k), dtype=torch.float32)
    if library().engine_gguf_dequantize(qtype, blocks.data_ptr(), n, k, out.data_ptr()) != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k})")
    return out
