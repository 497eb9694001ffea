"""The forward watchdog of a serving process (``--watchdog-timeout``, ``--soft-watchdog-timeout``).

A model forward that runs longer than the soft timeout dumps every thread's stack to the log
once; one that runs longer than the timeout trips the watchdog: ``/health`` answers 503, every
thread's stack is dumped, and the process exits with status 1 (``os._exit``: a stuck thread
cannot block it). The server never hangs silently.
"""

from __future__ import annotations

import faulthandler
import functools
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

log = logging.getLogger("engine.watchdog")

EXIT_GRACE_S = 1.0  #: between tripping and exiting: /health can answer 503 meanwhile


class Watchdog:
    """Times the calls of the functions it wraps (one at a time: the scheduler thread's).

    ``on_stuck`` runs once when a call exceeds ``timeout`` (default: exit with status 1 after
    :data:`EXIT_GRACE_S`); ``tripped`` is then true.
    """

    def __init__(self, timeout: float, soft_timeout: float | None = None, *,
                 on_stuck: Callable[[], None] | None = None) -> None:
        self.timeout, self.soft_timeout = timeout, soft_timeout
        self.on_stuck = on_stuck or _exit
        self.tripped = False
        self._since: float | None = None
        self._soft_dumped = False
        self._stop = threading.Event()
        checks = [t for t in (timeout, soft_timeout) if t]
        self._poll = min(1.0, min(checks) / 4) if checks else 1.0
        self._thread = threading.Thread(target=self._run, name="engine-watchdog", daemon=True)
        self._thread.start()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, timed by this watchdog."""
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._since, self._soft_dumped = time.monotonic(), False
            try:
                return fn(*args, **kwargs)
            finally:
                self._since = None
        return timed

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            since = self._since
            if since is None:
                continue
            busy = time.monotonic() - since
            if self.soft_timeout and busy > self.soft_timeout and not self._soft_dumped:
                self._soft_dumped = True
                log.warning("a model forward has run for %.1f s (--soft-watchdog-timeout "
                            "%g); stacks of all threads follow", busy, self.soft_timeout)
                _dump()
            if self.timeout and busy > self.timeout:
                self.tripped = True
                log.critical("a model forward has run for %.1f s (--watchdog-timeout %g): the "
                             "server is stuck and exits; stacks of all threads follow", busy,
                             self.timeout)
                _dump()
                self.on_stuck()
                return


def _dump() -> None:
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def _exit() -> None:
    time.sleep(EXIT_GRACE_S)
    logging.shutdown()
    os._exit(1)


def watch_forwards(runner: Any, timeout: float, soft_timeout: float | None) -> Watchdog:
    """Time every ``runner.forward`` call (the scheduler's one entry into the model) and every
    ``runner.synchronize`` (its wait for a forward it did not wait for at launch)."""
    watchdog = Watchdog(timeout, soft_timeout)
    runner.forward = watchdog.wrap(runner.forward)
    if hasattr(runner, "synchronize"):
        runner.synchronize = watchdog.wrap(runner.synchronize)
    return watchdog
