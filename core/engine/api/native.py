"""C kernels for the CPU, compiled once with the system compiler and cached.

A plugin (or the core) keeps its kernels as C sources next to its Python code and calls
:func:`load_library` with them: the first call compiles them into one shared library under the
engine cache directory (``$ENGINE_CACHE_DIR`` or ``~/.cache/engine``), named by a hash of the
sources, the flags, the compiler's version and this CPU's instruction-set flags; every later
process loads that file (a few milliseconds). ``-march=native`` is part of the default flags, so
the code may test ``__AVX512VNNI__``, ``__AVXVNNI__``... and pick its widest path at compile
time; the CPU's flags in the hash keep a cache shared between machines correct.

The library links OpenMP; inside a process that imported torch it shares torch's own OpenMP
runtime, so ``torch.set_num_threads`` sets its thread count too.

:func:`weight_buffer` gives the memory for weights such kernels stream every step (a CPU
decode step reads every weight once): 2 MiB pages where the kernel has transparent huge pages.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import mmap
import os
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.errors import PluginError

if TYPE_CHECKING:
    import torch

#: flags every library is built with (``extra`` flags are appended)
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


def cpu_flags() -> str:
    """The instruction-set flags of this CPU as the kernel reports them (empty off Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def _compiler_version(cc: str, name: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PluginError(f"{name}: cannot run the C compiler {cc!r}: {exc}") from None


def build(name: str, sources: Sequence[str], extra_flags: Sequence[str] = ()) -> str:
    """Compile ``sources`` (paths of C files, and of the headers they include: ``.h`` paths are
    hashed, not compiled) into ``<cache>/native/<name>-<hash>.so`` unless that file exists;
    returns its path. Raises :class:`PluginError` with the compiler's message."""
    from engine.plugins import cache_dir

    cc = os.environ.get("CC", "cc")
    flags = (*BASE_FLAGS, *extra_flags)
    digest = hashlib.sha256()
    for path in sources:
        with open(path, "rb") as fh:
            digest.update(fh.read())
    digest.update(" ".join(flags).encode())
    digest.update(_compiler_version(cc, name).encode())
    digest.update(cpu_flags().encode())
    folder = os.path.join(cache_dir(), "native")
    target = os.path.join(folder, f"{name}-{digest.hexdigest()[:16]}.so")
    if os.path.exists(target):
        return target
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    except OSError as exc:
        raise PluginError(f"{name}: cannot write the kernel cache {folder}: {exc} "
                          "(set ENGINE_CACHE_DIR)") from None
    os.close(fd)
    units = [path for path in sources if not path.endswith(".h")]
    proc = subprocess.run([cc, *flags, *units, "-o", tmp, "-lm"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise PluginError(f"{name}: compiling the kernels failed: {proc.stderr.strip()[:800]}")
    os.replace(tmp, target)  # atomic: concurrent builders end with the same file
    return target


@functools.lru_cache(maxsize=None)
def _load(name: str, sources: tuple[str, ...], extra_flags: tuple[str, ...]) -> ctypes.CDLL:
    return ctypes.CDLL(build(name, sources, extra_flags))


def load_library(name: str, sources: Sequence[str],
                 extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """The loaded library of ``sources`` (built on first use, then cached on disk and in this
    process). Declare each function's ``argtypes``/``restype`` on the result before calling."""
    return _load(name, tuple(sources), tuple(extra_flags))


#: the size of a transparent huge page (x86-64, aarch64 with 4 KiB base pages)
HUGE_PAGE = 2 << 20
#: bytes of each anonymous map weight buffers are cut from
_CHUNK = 32 << 20


class _WeightArena:
    """Cuts weight buffers from anonymous maps aligned to :data:`HUGE_PAGE` and advised
    ``MADV_HUGEPAGE``: pages come on first touch, 2 MiB at a time. Each buffer is a view that
    keeps its map alive; a map goes when its last buffer does (the arena keeps only the map it
    is filling)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: torch.Tensor | None = None  # the rest of the map being filled

    @staticmethod
    def _map(size: int) -> torch.Tensor:
        """``size`` bytes (a multiple of HUGE_PAGE) of a new map, starting at a huge page."""
        import torch

        buf = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        flat = torch.frombuffer(buf, dtype=torch.uint8)  # (holds a reference to buf)
        start = -flat.data_ptr() % HUGE_PAGE  # (a multiple of the base page: maps start on one)
        buf.madvise(mmap.MADV_HUGEPAGE, start, size)
        return flat[start:start + size]

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` bytes (uint8, 64-byte aligned; contents undefined)."""
        need = -(-max(nbytes, 1) // 64) * 64
        with self._lock:
            if need > _CHUNK // 4:  # a large weight: a map of its own
                return self._map(-(-need // HUGE_PAGE) * HUGE_PAGE)[:nbytes]
            if self._free is None or self._free.numel() < need:
                self._free = self._map(_CHUNK)
            out, self._free = self._free[:nbytes], self._free[need:]
            return out


_ARENA = _WeightArena() if hasattr(mmap, "MADV_HUGEPAGE") else None


def weight_buffer(shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialized CPU tensor (``dtype``: uint8 by default) for weights a kernel streams
    every step, in memory advised for transparent huge pages where the platform has them
    (``ENGINE_HUGE_PAGES=0``: plain ``torch.empty``). A decode step that reads ~100 MB of
    weights through 4 KiB pages misses the TLB ~25,000 times; through 2 MiB pages ~50 times,
    and the weights stream faster (docs/benchmarks/decode-cpu.md)."""
    import torch

    shape, dtype = tuple(shape), dtype or torch.uint8
    if _ARENA is None or os.environ.get("ENGINE_HUGE_PAGES") == "0":
        return torch.empty(shape, dtype=dtype)
    return _ARENA.take(math.prod(shape) * dtype.itemsize).view(dtype).view(shape)
