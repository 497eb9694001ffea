"""Size the CPU forward's OpenMP team to the cores other processes leave free.

Every parallel region of a forward (torch's kernels and the C kernels of the ``gguf`` plugin,
one OpenMP runtime) splits its work statically over the team and ends at a barrier. When
another process keeps one of our cores busy, the team's thread on that core runs only when the
kernel scheduler gives it a slice, and every region waits for it: a forward has hundreds of
regions, and batch-1 decode on 2 cores went from ~10 ms to over a second per token with one
busy process on the other core (docs/benchmarks/cpu-vs-llamacpp.md, "Contention"). A team no
larger than the free cores never waits for a preempted member: with the sizer the same
measurement gave ~1.5x, and the quiet speed stayed as it was (libgomp's own wait policy is
left alone: a short spin or a passive wait also bounds the slowdown, but costs quiet speed).

:class:`CpuThreads` measures, every ``period_s`` of stepping, the CPU time the machine's
cores (those this process may run on) spent busy minus the CPU time of this process, i.e. what
other processes used, and sets the calling thread's team size (``torch.set_num_threads``; the
OpenMP thread count is per calling thread, so call :meth:`update` from the thread that runs
the forwards) to the free cores, rounded, between 1 and the size at start. Reads of
``/proc/stat`` only: a few tens of microseconds every ``period_s``.

The scheduler of a CPU server uses one (:func:`for_device`) unless ``ENGINE_CPU_THREADS=fixed``
or ``OMP_NUM_THREADS`` is set (a thread count the user chose is kept as it is).
"""

from __future__ import annotations

import os
import time
from typing import Any

#: ``ENGINE_CPU_THREADS=fixed`` keeps the thread count torch starts with
ENV = "ENGINE_CPU_THREADS"


def _busy_seconds(cpus: set[int]) -> float | None:
    """Busy CPU seconds since boot of ``cpus`` (from /proc/stat), None where unreadable."""
    try:
        with open("/proc/stat") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines[1:]:
        if not line.startswith("cpu"):
            break
        name, *values = line.split()
        if int(name[3:]) in cpus:
            v = [int(x) for x in values[:8]]
            ticks += sum(v) - v[3] - v[4]  # all but idle and iowait
    return ticks / os.sysconf("SC_CLK_TCK")


def for_device(device: Any) -> CpuThreads | None:
    """A :class:`CpuThreads` for a scheduler on ``device`` (a torch.device), or None: not on
    CPU, ``ENGINE_CPU_THREADS=fixed``, ``OMP_NUM_THREADS`` set, one thread, or no /proc/stat."""
    if getattr(device, "type", device) != "cpu" or os.environ.get(ENV, "") == "fixed" \
            or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = CpuThreads()
    return threads if threads.enabled else None


class CpuThreads:
    """Follows the free cores with the calling thread's OpenMP team size (see the module)."""

    def __init__(self, max_threads: int | None = None, period_s: float = 0.25) -> None:
        import torch

        self._torch = torch
        self.max_threads = max_threads or torch.get_num_threads()
        self.threads = self.max_threads
        self.period_s = period_s
        self.cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(
            range(os.cpu_count() or 1))
        self._last: tuple[float, float, float] | None = None
        self.enabled = self.max_threads > 1 and _busy_seconds(self.cpus) is not None

    def _sample(self) -> tuple[float, float, float] | None:
        busy = _busy_seconds(self.cpus)
        if busy is None:
            return None
        return time.monotonic(), busy, time.process_time()

    def others(self, prev: tuple[float, float, float], now: tuple[float, float, float]) -> float:
        """Cores other processes used between two samples."""
        wall = now[0] - prev[0]
        return max(0.0, ((now[1] - prev[1]) - (now[2] - prev[2])) / wall) if wall > 0 else 0.0

    def want(self, others: float) -> int:
        """The team size for ``others`` cores used by other processes: the free cores, rounded
        (up from .5 when shrinking, from .75 when growing back, so that a load near the
        boundary does not flip it every period), between 1 and the size at start."""
        free = len(self.cpus) - others
        n = int(free + 0.5)
        if n > self.threads:
            n = max(self.threads, int(free + 0.25))
        return max(1, min(self.max_threads, n))

    def update(self) -> int:
        """Call before each forward; re-sizes at most once per ``period_s``. Returns the size."""
        if not self.enabled:
            return self.threads
        last = self._last
        if last is not None and time.monotonic() - last[0] < self.period_s:
            return self.threads
        now = self._sample()
        self._last = now
        if last is None or now is None:
            return self.threads
        want = self.want(self.others(last, now))
        if want != self.threads:
            self._torch.set_num_threads(want)
            self.threads = want
        return self.threads
