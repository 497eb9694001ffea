"""OpenMP settings for CPU serving, put in the environment before torch loads its runtime.

torch (and the C kernels of the ``gguf`` plugin, which share its runtime) use GNU OpenMP
(libgomp), which reads its settings once, when it loads. Its default makes a thread that
reaches the end of a parallel region spin for a long while (about 300,000 iterations) before
it sleeps. On a quiet machine that is what a forward wants; when another process keeps one of
the cores busy, the thread of ours that shares that core waits for a scheduler slice while its
partner spins on the other core, which the busy process could have used: every region of a
forward pays it, and batch-1 decode slowed ~14x. A short spin keeps the quiet speed (the
regions of a forward follow each other within microseconds) and hands the core back quickly
under contention. See docs/benchmarks/cpu-vs-llamacpp.md, "Contention".

A user's own setting wins: when either variable is already in the environment, none is set.
The team size itself follows the free cores at run time (engine.runtime.cpu_threads).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: what ``engine`` sets when the environment has neither variable
DEFAULTS = {"GOMP_SPINCOUNT": "10000"}
#: the variables that decide how long an idle OpenMP thread spins
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def omp_defaults(env: MutableMapping[str, str]) -> dict[str, str]:
    """The variables to add to ``env``: :data:`DEFAULTS`, or nothing when ``env`` sets any
    of :data:`WAIT_VARIABLES` (the user's own choice)."""
    if any(v in env for v in WAIT_VARIABLES):
        return {}
    return dict(DEFAULTS)


def apply_omp_defaults(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Add :func:`omp_defaults` to ``env`` (default: ``os.environ``); returns what was added.
    Has an effect only before torch is first imported."""
    env = os.environ if env is None else env
    added = omp_defaults(env)
    env.update(added)
    return added
