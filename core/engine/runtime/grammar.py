"""Constrained decoding on the runtime's side: compiled grammars, cached and built off the
scheduler thread.

:class:`Grammars` wraps the grammar backend the start-up assembly built
(:mod:`engine.api.grammar`). The HTTP handler awaits :meth:`Grammars.matchers` before it queues
a request: the spec is compiled in a small thread pool (or found in an LRU cache keyed by the
spec), and one matcher per sequence is made there too, so an invalid constraint is an HTTP 400
with nothing queued and a slow compilation never holds up the scheduler or the event loop. The
scheduler thread then advances each matcher, and :class:`MaskPrefetcher` computes the next
masks in a worker thread while the next forward runs (the sampler joins them just before it
samples).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from engine.api.grammar import (GrammarBackend, GrammarMatcher, GrammarSpec,
                                allocate_token_bitmask)

log = logging.getLogger("engine.grammar")

CACHE_SIZE = 256  #: compiled grammars kept (least recently used dropped first)
COMPILE_THREADS = 2


class GrammarDeadEnd(RuntimeError):
    """The request's grammar allows no next token; the request ends with ``abort``."""


class GrammarUnavailable(RuntimeError):
    """The grammar backend could not be built (the message says why); constrained requests get
    an HTTP 503."""


class Grammars:
    """A grammar backend with an LRU cache of compiled specs and a compile thread pool.

    The backend is given built, or as a ``factory`` run on first use (as the first constrained
    request needs it, in the compile pool): building one indexes the whole vocabulary (~0.3 s
    and ~25 MiB for a 49k-token vocabulary), which a server serving no constrained request never
    pays. A factory that fails makes every constrained request a :class:`GrammarUnavailable`
    (HTTP 503) with its reason, logged once.
    """

    def __init__(self, backend: GrammarBackend | None = None, cache_size: int = CACHE_SIZE, *,
                 factory: Any = None, name: str = "grammar backend") -> None:
        if backend is None and factory is None:
            raise ValueError("Grammars needs a backend or a factory")
        self._backend, self._factory, self._name = backend, factory, name
        self._error: str | None = None
        self._build_lock = threading.Lock()
        self.cache_size = cache_size
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="engine-grammar")

    @property
    def backend(self) -> GrammarBackend:
        """The backend, built by the factory on first use (:class:`GrammarUnavailable` when it
        could not be)."""
        if self._backend is None:
            with self._build_lock:
                if self._backend is None and self._error is None:
                    try:
                        self._backend = self._factory()
                        if self._backend is None:
                            self._error = f"the {self._name} built nothing"
                    except Exception as exc:  # noqa: BLE001 - reported on each request
                        self._error = (f"the {self._name} failed to start: "
                                       f"{type(exc).__name__}: {exc}")
                        log.error("%s", self._error)
        if self._backend is None:
            raise GrammarUnavailable(self._error or f"no {self._name}")
        return self._backend

    async def loaded(self) -> GrammarBackend:
        """:attr:`backend`, built (on first use) in the compile pool, off the event loop."""
        if self._backend is not None:
            return self._backend
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: self.backend)

    def compiled(self, spec: GrammarSpec) -> Any:
        """The compiled grammar of ``spec`` (cached); raises
        :class:`~engine.api.grammar.InvalidGrammar`."""
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                return self._cache[spec]
        compiled = self.backend.compile(spec)
        with self._lock:
            self._cache[spec] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _matchers(self, spec: GrammarSpec, n: int) -> list[GrammarMatcher]:
        compiled = self.compiled(spec)
        return [self.backend.matcher(compiled) for _ in range(n)]

    async def matchers(self, spec: GrammarSpec, n: int) -> list[GrammarMatcher]:
        """``n`` fresh matchers of ``spec``, made in the compile pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._matchers, spec, n)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


#: ``ENGINE_GRAMMAR_OVERLAP=0`` computes every mask when its token is sampled instead
OVERLAP_ENV = "ENGINE_GRAMMAR_OVERLAP"


def overlap_enabled() -> bool:
    """Whether next-token masks are computed ahead, in a worker (the default), or inline."""
    return os.environ.get(OVERLAP_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class PendingMask:
    """One sequence's next-token mask, being filled by the :class:`MaskPrefetcher`'s worker:
    row ``index`` of ``bitmask``, ready when ``future`` is done."""

    __slots__ = ("future", "bitmask", "index")

    def __init__(self, future: Future, bitmask: Any, index: int) -> None:
        self.future, self.bitmask, self.index = future, bitmask, index

    def result(self) -> Any:
        """The filled bitmask row (waits for the worker); raises what the matcher raised."""
        errors = self.future.result()
        if self.index in errors:
            raise errors[self.index]
        return self.bitmask[self.index]


def _fill_rows(matchers: list[GrammarMatcher], bitmask: Any) -> dict[int, Exception]:
    """Fill row ``k`` of ``bitmask`` from ``matchers[k]``; one matcher's failure is its row's."""
    errors: dict[int, Exception] = {}
    for k, matcher in enumerate(matchers):
        try:
            matcher.fill_bitmask(bitmask, k)
        except Exception as exc:  # noqa: BLE001 - reported to that row's sampling alone
            errors[k] = exc
    return errors


class MaskPrefetcher:
    """Computes constrained sequences' next-token masks in one worker thread, overlapped with
    the scheduler's host work and the next forward.

    The mask of a sequence's next token depends only on the tokens its matcher has accepted, so
    once a step's tokens are appended (and accepted), :meth:`prefetch` hands the matchers of the
    sequences still running to the worker, which fills one bitmask for all of them while the
    scheduler builds the next batch and the model runs it (llguidance and xgrammar release the
    GIL while they compute). Each sequence gets a :class:`PendingMask` in its ``grammar_mask``;
    the sampler joins it just before it applies the mask, and computes the mask itself when
    there is none. Between :meth:`prefetch` and that join the scheduler touches no matcher of
    the batch; a sequence that ends, dead-ends or is aborted meanwhile simply never joins its
    mask (the worker never waits on the scheduler, so nothing can deadlock).
    """

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = overlap_enabled() if enabled is None else enabled
        self._pool: ThreadPoolExecutor | None = None

    def prefetch(self, reqs: list[Any], vocab_size: int) -> None:
        """Start filling the next mask of each request of ``reqs`` that is constrained and not
        finished (called by the scheduler thread right after their tokens were accepted)."""
        rows = [r for r in reqs if r.grammar is not None and r.finish_reason is None]
        if not rows or not self.enabled:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="engine-grammar-mask")
        bitmask = allocate_token_bitmask(len(rows), vocab_size)
        future = self._pool.submit(_fill_rows, [r.grammar for r in rows], bitmask)
        for k, req in enumerate(rows):
            req.grammar_mask = PendingMask(future, bitmask, k)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
