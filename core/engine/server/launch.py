"""Start-up: from a frozen config to a listening server."""

from __future__ import annotations

import logging

from engine.config import ServerConfig
from engine.plugins.registry import Registry

log = logging.getLogger("engine.serve")


def serve(config: ServerConfig, registry: Registry) -> int:
    """Build the runtime and serve until interrupted."""
    try:
        from engine.server import app  # noqa: F401  (present once the runtime lands)
    except ImportError:
        from engine.cli.serve import plan

        print("configuration resolved; the serving runtime is not part of this build yet. "
              "Would run:")
        print(f"  model: {config.model_path or 'default (SmolLM2-135M-Instruct Q4_1 GGUF)'}")
        for line in plan(config, registry):
            print(f"  {line}")
        return 0
    from engine.server.app import run_server

    return run_server(config, registry)
