"""The plugin manifest: what a plugin says about itself without importing its implementation.

A plugin distribution's entry point names a :class:`Plugin` object that lives in a light module
(standard library and :mod:`engine.plugins` only). Everything the core needs for listing, help,
availability and ``auto`` selection is here; the implementation is named by a lazy
``"module:attribute"`` reference and imported only when the plugin is selected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping

#: Major version of the plugin API published by this core. A plugin declares the major it was
#: built for (``Plugin.api_version``); any other major is listed as incompatible and never loaded.
PLUGIN_API_VERSION = 2


@dataclass(frozen=True)
class Option:
    """A plugin-specific command-line option (``--triton-attention-num-kv-splits``).

    The option appears in ``engine serve --help`` (and as a ``--config`` YAML key) when the
    plugin is installed; its parsed value reaches the plugin's family hook as ``options[dest]``
    (also ``options.<dest>``), the declared ``default`` when unset.
    """

    flag: str  #: the long flag, with leading dashes
    type: str = "str"  #: one of "str", "int", "float", "bool" (a store_true switch), "json"
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The key under which the parsed value is stored."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Requires:
    """Cheap facts a plugin needs to run; checked without importing anything heavy."""

    #: requirement strings in PEP 508 form, e.g. ``"flashinfer-python>=0.5"`` or ``"torch_npu"``;
    #: ``"a | b"`` is met by either (wheel variants of one library)
    packages: tuple[str, ...] = ()
    #: device kinds it runs on: any of "cpu", "cuda", "rocm", "xpu", "npu", "mps"
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: lowest CUDA compute capability (major, minor) when running on "cuda"
    min_compute_capability: tuple[int, int] | None = None
    #: highest CUDA compute capability (major, minor), inclusive
    max_compute_capability: tuple[int, int] | None = None
    #: CPU flags from /proc/cpuinfo, e.g. ``("avx512f", "amx_tile")``
    cpu_features: tuple[str, ...] = ()
    #: values of ``sys.platform`` it runs on; empty means any
    os: tuple[str, ...] = ()
    #: programs it runs, found on PATH (e.g. ``("cc",)`` for kernels compiled on first use)
    executables: tuple[str, ...] = ()
    #: model features that must be present, e.g. ``("mla",)`` or ``("deepseek_sparse_attention",)``;
    #: checked only when a model is known (``engine serve``), shown in listings otherwise
    model_features: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plugin:
    """One choice of one family. Build it in the module your entry point names."""

    name: str  #: the CLI choice, exactly as typed by users (``"torch_native"``, ``"deepseek-r1"``)
    family: str  #: a key of :data:`engine.plugins.families.FAMILIES`
    #: ``"module"`` or ``"module:attribute"``: the object (carrying ``@hookimpl`` functions) that is
    #: registered with the plugin manager when this plugin is selected
    implementation: str | None
    description: str = ""
    api_version: int = PLUGIN_API_VERSION
    requires: Requires = field(default_factory=Requires)
    #: higher wins when the core picks ``auto`` among available plugins; 0 never picked by auto
    priority: int = 0
    options: tuple[Option, ...] = ()
    #: set when this build has no implementation: the line ``engine serve`` refuses it with, e.g.
    #: ``"needs torch_npu and an Ascend NPU; no adapter in this build"``
    not_implemented: str | None = None
    #: free-form facts shown by ``engine plugins show`` (formats served, notes, certainty)
    notes: tuple[str, ...] = ()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field when the manifest is malformed."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("manifest field 'name' must be a non-empty string")
        if not isinstance(self.family, str) or not self.family:
            raise ValueError("manifest field 'family' must be a non-empty string")
        if not isinstance(self.api_version, int):
            raise ValueError("manifest field 'api_version' must be an int")
        if self.not_implemented is None:
            impl = self.implementation
            if not isinstance(impl, str) or impl.count(":") > 1 or not all(impl.split(":")):
                raise ValueError(
                    "manifest field 'implementation' must be 'module' or 'module:attribute' "
                    f"(got {impl!r}); set 'not_implemented' for a plugin without one"
                )
        if not isinstance(self.requires, Requires):
            raise ValueError("manifest field 'requires' must be an engine.plugins.Requires")
        for opt in self.options:
            if not isinstance(opt, Option) or not opt.flag.startswith("--"):
                raise ValueError(f"manifest option {opt!r} must be an Option with a '--flag'")
            if opt.type not in ("str", "int", "float", "bool", "json"):
                raise ValueError(f"option {opt.flag}: unknown type {opt.type!r}")


class Options(Mapping[str, Any]):
    """One plugin's parsed options, read-only: ``options["num_kv_splits"]`` or
    ``options.num_kv_splits``. Every option the manifest declares is present (its default when
    the user set nothing)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_values", MappingProxyType(dict(values or {})))

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no plugin option {name!r} (options: "
                                 f"{', '.join(self._values) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("plugin options are read-only")

    def __repr__(self) -> str:
        return f"Options({dict(self._values)!r})"
