"""``engine serve``: validate and resolve everything, then start the server."""

from __future__ import annotations

import logging

from engine.cli.args import parse_config
from engine.config import ServerConfig
from engine.plugins.families import family_for_flag
from engine.plugins.registry import Registry


def run(argv: list[str]) -> int:
    registry = Registry(trace="--trace-plugins" in argv)
    config = parse_config(argv, registry)
    logging.getLogger().setLevel(config.log_level.upper())
    from engine.server.launch import serve

    return serve(config, registry)


def plan(config: ServerConfig, registry: Registry) -> list[str]:
    """One line per family flag: what was asked for and which plugin answers it."""
    lines = []
    for dest, (fam, fl) in family_for_flag().items():
        value = getattr(config, dest)
        if value is None:
            continue
        rec = registry.find(value.partition("@")[0], fam.name)
        where = f" ({rec[0].distribution} {rec[0].version})" if rec else ""
        lines.append(f"{fl.flag} {value}{where}")
    return lines
