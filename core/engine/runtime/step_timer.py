"""Wall and thread-CPU time per phase of the scheduler's steps (``--show-time-cost``,
``ENGINE_STEP_TIMING=N``)."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("engine.scheduler")

SHOW_TIME_COST_EVERY = 100  #: steps per summary of ``--show-time-cost``


class StepTimer:
    """Wall and thread-CPU seconds per phase of the scheduler's steps, logged every ``every``.

    Enabled by ``ENGINE_STEP_TIMING=N`` (log a summary every N steps). ``mark(phase)`` charges
    the time since the previous mark to ``phase``; wall time well above CPU time in a Python
    phase is time the thread waited for the GIL or for a core.
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self._last = (time.perf_counter(), time.thread_time())
        self._phases: dict[str, list[float]] = {}
        self._modes: dict[str, int] = {}
        self._steps = 0

    def mark(self, phase: str) -> None:
        now = (time.perf_counter(), time.thread_time())
        acc = self._phases.setdefault(phase, [0.0, 0.0])
        acc[0] += now[0] - self._last[0]
        acc[1] += now[1] - self._last[1]
        self._last = now

    def end_step(self, mode: str, batch_size: int) -> None:
        self.mark("rest")
        key = f"{mode}{batch_size}"
        self._modes[key] = self._modes.get(key, 0) + 1
        self._steps += 1
        if self._steps >= self.every:
            self.flush()

    def flush(self) -> None:
        """Log the per-step means since the last flush and start over."""
        if not self._steps:
            return
        n = self._steps
        parts = " ".join(f"{k}={w / n * 1000:.2f}/{c / n * 1000:.2f}"
                         for k, (w, c) in self._phases.items())
        steps = " ".join(f"{k}:{v}" for k, v in sorted(self._modes.items()))
        log.info("step timing over %d steps (ms per step, wall/cpu): %s | steps %s",
                 n, parts, steps)
        self._phases, self._modes, self._steps = {}, {}, 0


class NoTimer:
    """The disabled :class:`StepTimer`: every call does nothing."""

    def mark(self, phase: str) -> None:
        pass

    def end_step(self, mode: str, batch_size: int) -> None:
        pass

    def flush(self) -> None:
        pass


def step_timer(show_time_cost: bool) -> StepTimer | NoTimer:
    """The scheduler's timer: ``ENGINE_STEP_TIMING=N`` (a summary every N steps), else
    ``--show-time-cost`` (every :data:`SHOW_TIME_COST_EVERY`), else one that does nothing."""
    every = os.environ.get("ENGINE_STEP_TIMING", "")
    if every.isdigit() and int(every) > 0:
        return StepTimer(int(every))
    return StepTimer(SHOW_TIME_COST_EVERY) if show_time_cost else NoTimer()
