"""What the handlers of one server share: its runtime, metrics and names, and the :class:`Drain`
that admits requests and shuts the server down gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from engine.assembly import ParserFactories
from engine.config import ServerConfig
from engine.models.completion_templates import CompletionTemplate
from engine.runtime.frontend import Runtime
from engine.runtime.watchdog import Watchdog
from engine.server.metrics import Metrics

if TYPE_CHECKING:
    from engine.server.generation import Generation

log = logging.getLogger("engine.serve")

RETRY_AFTER_S = 1  #: the ``Retry-After`` of every 503 (overloaded, or shutting down)
END_WAIT_S = 5.0  #: after the grace period: how long the ended requests get to send their end


class Drain:
    """Requests in flight, and the graceful shutdown of one server (its event loop only).

    Every admitted HTTP request runs inside :meth:`track`; every generation not yet finished is
    in :attr:`generations`. :meth:`run` sets :attr:`draining` (the guard then answers new
    requests 503), waits up to ``grace_s`` for the requests in flight, then sets
    :attr:`closed` and ends the generations left (each answers 503: a JSON error, or on a
    stream an error event and ``[DONE]``), and waits for those answers to go out.
    """

    def __init__(self) -> None:
        self.draining = False
        self.closed = False
        self.in_flight = 0
        self.generations: weakref.WeakSet[Generation] = weakref.WeakSet()
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def run(self, grace_s: float) -> None:
        self.draining = True
        log.info("shutting down: %d requests in flight get %g s to finish; new requests get "
                 "503", self.in_flight, grace_s)
        if await self._idle_within(grace_s):
            return
        self.closed = True
        log.warning("ending %d requests still running after %g s", len(self.generations),
                    grace_s)
        for gen in list(self.generations):
            gen.close()
        await self._idle_within(END_WAIT_S)

    async def _idle_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), seconds)
        except asyncio.TimeoutError:
            return False
        return True


@dataclass
class ServerState:
    config: ServerConfig
    runtime: Runtime
    metrics: Metrics
    model_name: str
    model_path: str
    started: float
    parsers: ParserFactories  #: the chat parsers' factories, built once at start-up
    watchdog: Watchdog | None = None  #: times the model's forwards; tripped: /health fails
    #: ``--completion-template``'s template, or None
    completion_template: CompletionTemplate | None = None
    drain: Drain = field(default_factory=Drain)
