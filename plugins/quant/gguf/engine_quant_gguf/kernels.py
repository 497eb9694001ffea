"""Build (once, cached) and call the C kernels of ``kernels.c`` through ctypes.

The shared library is compiled with the system C compiler into the engine cache directory
(``$ENGINE_CACHE_DIR`` or ``~/.cache/engine``), named by a hash of the source, the flags and the
compiler, and reused by every later process. It links OpenMP; inside a process that imported torch
it shares torch's own OpenMP runtime, so ``torch.set_num_threads`` sets its thread count too.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile

import torch

from engine.api import PluginError
from engine.api import cache_dir

FLAGS = ("-O3", "-std=c11", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
#: GGML type ids the kernels read
QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
SOURCE = os.path.join(os.path.dirname(__file__), "kernels.c")


def _cache_dir() -> str:
    return os.path.join(cache_dir(), "gguf-kernels")


def _build(cc: str) -> str:
    with open(SOURCE, "rb") as fh:
        source = fh.read()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PluginError(f"gguf: cannot run the C compiler {cc!r}: {exc}") from None
    tag = hashlib.sha256(source + " ".join(FLAGS).encode() + version.encode()).hexdigest()[:16]
    target = os.path.join(_cache_dir(), f"gguf-{tag}.so")
    if os.path.exists(target):
        return target
    try:
        os.makedirs(_cache_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=_cache_dir())
    except OSError as exc:
        raise PluginError(f"gguf: cannot write the kernel cache {_cache_dir()}: {exc} "
                          "(set ENGINE_CACHE_DIR)") from None
    os.close(fd)
    proc = subprocess.run([cc, *FLAGS, SOURCE, "-o", tmp], capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise PluginError(f"gguf: compiling the kernels failed: {proc.stderr.strip()[:500]}")
    os.replace(tmp, target)  # atomic: concurrent builders end with the same file
    return target


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded kernel library (built on first call)."""
    lib = ctypes.CDLL(_build(os.environ.get("CC", "cc")))
    fn = lib.engine_gguf_matmul
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    lib.engine_gguf_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_int64, ctypes.c_void_p]
    lib.engine_gguf_dequantize.restype = ctypes.c_int
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


def dequantize(qtype: int, blocks: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """float32 [n, k] values of the packed weight, bit-identical to the gguf package's."""
    out = torch.empty((n, k), dtype=torch.float32)
    if library().engine_gguf_dequantize(qtype, blocks.data_ptr(), n, k, out.data_ptr()) != 0:
        raise ValueError(f"gguf kernel: bad arguments (type {qtype}, K={k})")
    return out
