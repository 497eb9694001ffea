"""Constrained decoding on the runtime's side: compiled grammars, cached and built off the
scheduler thread.

:class:`Grammars` wraps the grammar backend the start-up assembly built
(:mod:`engine.api.grammar`). The HTTP handler awaits :meth:`Grammars.matchers` before it queues
a request: the spec is compiled in a small thread pool (or found in an LRU cache keyed by the
spec), and one matcher per sequence is made there too, so an invalid constraint is an HTTP 400
with nothing queued and a slow compilation never holds up the scheduler or the event loop. The
scheduler thread then only asks each matcher for its mask and advances it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.api.grammar import GrammarBackend, GrammarMatcher, GrammarSpec

CACHE_SIZE = 256  #: compiled grammars kept (least recently used dropped first)
COMPILE_THREADS = 2


class GrammarDeadEnd(RuntimeError):
    """The request's grammar allows no next token; the request ends with ``abort``."""


class Grammars:
    """A grammar backend with an LRU cache of compiled specs and a compile thread pool."""

    def __init__(self, backend: GrammarBackend, cache_size: int = CACHE_SIZE) -> None:
        self.backend = backend
        self.cache_size = cache_size
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="engine-grammar")

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
