"""``engine serve``: argv -> frozen config -> start-up assembly -> HTTP server."""

from __future__ import annotations

import gc
import logging

from engine.cli.args import parse_config
from engine.errors import EngineError
from engine.plugins.registry import Registry

log = logging.getLogger("engine.serve")


class MissingDependency(EngineError):
    """A package the server needs is not installed."""


def run(argv: list[str]) -> int:
    # Start-up creates ~a million long-lived objects (torch, the HTTP stack, the model): the
    # cyclic collector would walk them again and again (~0.2 s of a ~2 s start). It is off
    # until the server is ready, which freezes what exists by then out of later collections
    # and turns it back on (engine.server.app); any other way out turns it back on here.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(argv)
    finally:
        if was_enabled:
            gc.enable()


def _run(argv: list[str]) -> int:
    registry = Registry()
    config = parse_config(argv, registry)
    logging.getLogger().setLevel(config.log_level.upper())
    if config.accepted:
        from engine.cli.surface import ACCEPTED

        for flag, value in config.accepted.items():
            shown = "" if value is True else f" {value}"
            log.info("%s%s is accepted and changes nothing here: %s", flag, shown,
                     ACCEPTED[flag].why)
    try:
        from engine.server.app import run_server
    except ModuleNotFoundError as exc:
        if (exc.name or "engine").partition(".")[0] == "engine":
            raise
        raise MissingDependency(f"the HTTP server needs the '{exc.name}' package, which is not "
                                f"installed (pip install {exc.name})") from None
    from engine.assembly import Assembly

    return run_server(config, Assembly(config, registry))
