"""Triton kernel builds of this process, counted through Triton's ``jit_cache_hook``.

A JIT kernel is built the first time it launches with a new specialisation: the argument
dtypes, the constexprs, the integer arguments Triton specialises (equal to 1, divisible by 16).
Building means compiling, or loading from the on-disk cache. Either way the launching step
waits for it. The server's warm-up is meant to cover every variant a served shape needs.
:data:`BUILDS` counts the builds, and once :meth:`KernelBuilds.mark_ready` has been called
(``/health`` turned ready) it logs each new build as a warning naming the kernel: a variant the
warm-up missed, which a request waited for. ``/metrics`` exports the counts
(``engine_kernel_builds``, ``engine_kernel_builds_after_ready``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

log = logging.getLogger("engine.runtime")


class KernelBuilds:
    def __init__(self) -> None:
        self.total = 0
        self.after_ready = 0
        self.ready = False
        #: the last kernels built after ready (their Triton signatures)
        self.late: deque[str] = deque(maxlen=32)
        self._lock = threading.Lock()
        self._installed = False
        self._previous: Any = None

    def install(self) -> bool:
        """Hook into Triton (once; any hook already set is still called). False where this
        Triton has no ``knobs.runtime.jit_cache_hook``."""
        if self._installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_cache_hook"):
            return False
        self._previous = runtime.jit_cache_hook
        runtime.jit_cache_hook = self._hook
        self._installed = True
        return True

    @property
    def installed(self) -> bool:
        return self._installed

    def mark_ready(self) -> int:
        """From now on every build is late; returns the builds so far."""
        with self._lock:
            self.ready = True
            return self.total

    def _hook(self, **kwargs: Any) -> bool:
        with self._lock:
            self.total += 1
            late = self.ready
            if late:
                self.after_ready += 1
        if late:
            what = str(kwargs.get("repr") or kwargs.get("key"))
            self.late.append(what)
            log.warning("Triton kernel built after ready (a variant the warm-up did not "
                        "cover): %s", what[:300])
        if self._previous is not None:
            return bool(self._previous(**kwargs))
        return False  # False: go on and build it


#: the process's counter (Triton's hook is process-wide)
BUILDS = KernelBuilds()
