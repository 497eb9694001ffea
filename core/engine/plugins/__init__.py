"""The plugin system: families, manifests, discovery, hook specifications and the registry.

Plugins import nothing from here: their whole API is :mod:`engine.api`. This package is light
(no torch, no pluggy until the registry loads a plugin).
"""

from __future__ import annotations

import os


def cache_dir() -> str:
    """The engine's cache directory: ``$ENGINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/engine`` or
    ``~/.cache/engine`` (discovery's manifest cache; plugins keep their builds below it)."""
    return os.environ.get("ENGINE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "engine")
