"""The plugin API: manifests, hook markers and the family table. Light: no torch here.

``hookimpl`` marks hook implementations (see :mod:`engine.plugins.hookspecs`);
``load_product(family, name, **hook_kwargs)`` resolves a choice and returns what its family hook
returns. Both are imported lazily so that reading manifests costs no pluggy import.
"""

from __future__ import annotations

from typing import Any

from engine.plugins.manifest import PLUGIN_API_VERSION, Option, Plugin, Requires

__all__ = ["PLUGIN_API_VERSION", "Option", "Plugin", "Requires", "cache_dir", "hookimpl",
           "load_product"]


def cache_dir() -> str:
    """The engine's cache directory: ``$ENGINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/engine`` or
    ``~/.cache/engine`` (discovery's manifest cache; plugins keep their builds below it)."""
    import os

    return os.environ.get("ENGINE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "engine")


def load_product(family: str, name: str, **hook_kwargs: Any) -> Any:
    """See :func:`engine.plugins.registry.load_product`."""
    from engine.plugins.registry import load_product as _load

    return _load(family, name, **hook_kwargs)


def __getattr__(name: str) -> Any:
    if name == "hookimpl":
        from engine.plugins.hookspecs import hookimpl

        return hookimpl
    raise AttributeError(f"module 'engine.plugins' has no attribute {name!r}")
