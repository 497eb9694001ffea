"""Architecture name (``config.json`` ``architectures[0]``) -> model class, imported lazily.

Plugins add architectures through the cross-cutting hook ``engine_register_architectures``;
:meth:`engine.assembly.Assembly.architectures` calls it on every selected plugin.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.errors import ConfigError

_LLAMA = "engine.models.llama:LlamaForCausalLM"
BUILTIN: dict[str, str] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": _LLAMA,
    "Qwen3ForCausalLM": _LLAMA,
    "MixtralForCausalLM": _LLAMA,
    "Qwen2MoeForCausalLM": _LLAMA,
    "Qwen3MoeForCausalLM": _LLAMA,
    "OlmoeForCausalLM": _LLAMA,
}


class ArchitectureRegistry:
    """Lazy ``"module:Class"`` references by architecture name; a duplicate is an error."""

    def __init__(self, builtin: dict[str, str] | None = None) -> None:
        self._refs: dict[str, str] = dict(BUILTIN if builtin is None else builtin)

    def register(self, architecture: str, reference: str, *, replace: bool = False) -> None:
        """Add ``architecture`` -> ``"module:Class"``; ``replace=True`` to override one."""
        if ":" not in reference:
            raise ValueError(f"architecture {architecture}: reference must be 'module:Class', "
                             f"got {reference!r}")
        if architecture in self._refs and not replace and self._refs[architecture] != reference:
            raise ValueError(f"architecture {architecture} is already registered as "
                             f"{self._refs[architecture]}; pass replace=True to override")
        self._refs[architecture] = reference

    @property
    def names(self) -> list[str]:
        return sorted(self._refs)

    def resolve(self, architecture: str) -> type[Any]:
        """The model class, imported now; :class:`ConfigError` listing the known names."""
        ref = self._refs.get(architecture)
        if ref is None:
            raise ConfigError(f"unsupported model architecture {architecture!r}; supported: "
                              f"{', '.join(self.names)}")
        module, _, cls = ref.partition(":")
        return getattr(importlib.import_module(module), cls)
