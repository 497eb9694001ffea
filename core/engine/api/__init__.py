"""The public plugin API: everything a plugin may import from the core, and nothing else.

``PLUGIN_API_VERSION`` versions exactly this package. A plugin imports the manifest types and
the hook marker from here, and each family's interface from one submodule:

==========================  ==============================================================
``engine.api``              :class:`Plugin`, :class:`Requires`, :class:`Option` (manifests),
                            :class:`Options` (a plugin's parsed options), ``hookimpl``,
                            :class:`PluginError`, :class:`ConfigError`, :func:`cache_dir`
``engine.api.attention``    attention backends: ``AttentionBackend``, ``KVPool``, ``Batch``
``engine.api.quant``        quantization methods: ``QuantMethod``, ``Linear``, ``PackedWeight``
``engine.api.parsers``      reasoning and tool-call parsers and their shared machinery
``engine.api.models``       model-config parsers: ``ModelConfig`` and the readers of HF
                            directories, GGUF files and Mistral ``params.json``
``engine.api.grammar``      grammar backends of constrained decoding: ``GrammarBackend``,
                            ``GrammarMatcher``, ``GrammarSpec``, the token-bitmask helpers
``engine.api.moe``          routed-expert runners and expert-parallel all-to-all
``engine.api.speculative``  draft-token proposers
``engine.api.hicache``      KV page storage behind the host cache: ``HiCacheStorage``,
                            ``StorageConfig``
``engine.api.eviction``     radix-cache eviction orders: ``EvictionPolicy``, ``NodeView``
==========================  ==============================================================

The hooks each family implements, and what they receive and return, are listed with their
contracts in :mod:`engine.plugins.hookspecs`. This module is light (no torch, no pluggy until
``hookimpl`` is used): manifest modules import it during discovery.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ConfigError, PluginError
from engine.plugins.manifest import PLUGIN_API_VERSION, Option, Options, Plugin, Requires

__all__ = ["PLUGIN_API_VERSION", "ConfigError", "Option", "Options", "Plugin", "PluginError",
           "Requires", "cache_dir", "hookimpl"]


def cache_dir() -> str:
    """The engine's cache directory: ``$ENGINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/engine`` or
    ``~/.cache/engine``. Plugins keep their builds (compiled kernels...) below it."""
    from engine.plugins import cache_dir as _cache_dir

    return _cache_dir()


def __getattr__(name: str) -> Any:
    if name == "hookimpl":
        from engine.plugins.hookspecs import hookimpl

        return hookimpl
    raise AttributeError(f"module 'engine.api' has no attribute {name!r}")
