"""The cross-cutting hooks reach a registered plugin during real generation."""

from __future__ import annotations

from engine.api import hookimpl
from engine.assembly import Assembly
from engine.config import ServerConfig
from engine.runtime.offline import Engine

from _default_model import default_runner


class Observer:
    """A plugin object implementing only cross-cutting hooks."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.tokens: list[int] = []

    @hookimpl
    def engine_startup(self, config):
        self.events.append("startup")

    @hookimpl
    def engine_on_request(self, request):
        self.events.append(f"request {len(request.origin_input_ids)}")

    @hookimpl
    def engine_after_forward(self, batch, next_token_ids):
        self.events.append(batch.mode.value)
        self.tokens += next_token_ids

    @hookimpl
    def engine_shutdown(self):
        self.events.append("shutdown")


def test_observer_hooks_see_startup_requests_forwards_and_shutdown():
    runner = default_runner()
    observer = Observer()
    assembly = Assembly(ServerConfig())
    assembly.registry.pm.register(observer, name="test.observer")
    engine = Engine(runner=runner, assembly=assembly, disable_radix_cache=True)
    out = engine.generate([[1, 2, 3, 4]], {"max_new_tokens": 3, "temperature": 0,
                                           "ignore_eos": True})
    engine.shutdown()
    ev = observer.events
    assert ev[0] == "startup" and ev[-1] == "shutdown"
    assert ev[1] == "request 4"
    assert ev.count("extend") == 1 and ev.count("decode") == 2
    assert observer.tokens == out[0]["output_ids"]
