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
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Sequence

from engine.errors import PluginError

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
    """Compile ``sources`` (paths of C files) into ``<cache>/native/<name>-<hash>.so`` unless that
    file exists; returns its path. Raises :class:`PluginError` with the compiler's message."""
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
    proc = subprocess.run([cc, *flags, *sources, "-o", tmp, "-lm"], capture_output=True,
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
