"""Selection, lazy loading and hook calls: from a choice name to the object a family hook returns.

``Registry`` owns one pluggy ``PluginManager``. Selecting a choice resolves the name (exact,
``name@distribution`` to pin one of two conflicting distributions, or ``auto``), refuses it with
its reason when it cannot run here, imports only its implementation, registers it with the plugin
manager (pluggy validates every ``@hookimpl`` against :mod:`engine.plugins.hookspecs`) and calls the
family hook on that plugin alone.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import time
from typing import TYPE_CHECKING, Any

from engine.errors import NoAnswerError, PluginError
from engine.plugins.discovery import AVAILABLE, CONFLICT, PluginRecord, discover, model_unmet
from engine.plugins.families import FAMILIES

if TYPE_CHECKING:
    import pluggy



class Registry:
    """Installed plugins of every family, and the ones loaded in this process."""

    def __init__(self, records: list[PluginRecord] | None = None, *, trace: bool = False) -> None:
        self.records = discover() if records is None else records
        self._pm: pluggy.PluginManager | None = None
        self._trace = trace
        self._loaded: dict[str, Any] = {}  # qualified name -> registered implementation
        self._owner: dict[int, PluginRecord] = {}  # id(implementation) -> record

    def enable_trace(self) -> None:
        """Log every hook call from now on (``--trace-plugins``)."""
        if not self._trace:
            self._trace = True
            if self._pm is not None:
                self._enable_trace()

    def hook_argnames(self, hook_name: str) -> tuple[str, ...]:
        """The argument names of a hook specification."""
        spec = getattr(self.pm.hook, hook_name).spec
        return tuple(spec.argnames) if spec is not None else ()

    @property
    def pm(self) -> "pluggy.PluginManager":
        """The plugin manager, created on first use (listing plugins never needs it)."""
        if self._pm is None:
            import pluggy

            from engine.plugins import hookspecs

            self._pm = pluggy.PluginManager(hookspecs.PROJECT)
            self._pm.add_hookspecs(hookspecs)
            if self._trace:
                self._enable_trace()
        return self._pm

    # ------------------------------------------------------------------ lookup

    def family_records(self, family: str) -> list[PluginRecord]:
        if family not in FAMILIES:
            raise PluginError(f"unknown plugin family {family!r}; families: {', '.join(FAMILIES)}")
        return [r for r in self.records if r.family == family]

    def choices(self, family: str) -> list[str]:
        """Installed choice names (sorted, unique), whatever their status."""
        return sorted({r.name for r in self.family_records(family)})

    def find(self, name: str, family: str | None = None) -> list[PluginRecord]:
        return [r for r in self.records if r.name == name and (family is None or r.family == family)]

    def resolve(
        self, family: str, choice: str, *, flag: str | None = None,
        model_features: frozenset[str] | None = None,
    ) -> PluginRecord:
        """The record a user's choice selects, or a :class:`PluginError` saying why not."""
        fam = FAMILIES[family] if family in FAMILIES else None
        label = flag or (fam.flags[0].flag if fam else family)
        name, _, pinned = choice.partition("@")
        records = self.family_records(family)
        if name == "auto" and not any(r.name == "auto" for r in records):
            return self.auto(family, model_features=model_features, flag=label)
        if fam is not None and fam.ignore_case:
            name = next((r.name for r in records if r.name.lower() == name.lower()), name)
        matches = [r for r in records if r.name == name and (not pinned or r.distribution == pinned)]
        if not matches:
            raise PluginError(self._unknown_message(label, choice, records))
        if len(matches) > 1:
            dists = " and ".join(sorted(r.distribution for r in matches))
            raise PluginError(
                f"{label} {name}: registered by {dists}; pin one as '{name}@<distribution>'"
            )
        rec = matches[0]
        if rec.status not in (AVAILABLE, CONFLICT) or (rec.status == CONFLICT and not pinned):
            raise PluginError(f"{label} {name} ({rec.distribution}) is {rec.status}: {rec.reason}")
        if model_features is not None:
            reason = model_unmet(rec, model_features)
            if reason:
                raise PluginError(f"{label} {name} ({rec.distribution}) is unavailable: {reason}")
        return rec

    def auto(
        self, family: str, *, model_features: frozenset[str] | None = None, flag: str = "",
    ) -> PluginRecord:
        """The highest-priority available plugin (ties: by name); error listing reasons if none."""
        records = self.family_records(family)
        candidates = [
            r for r in records
            if r.available and r.manifest and r.manifest.priority > 0
            and (model_features is None or not model_unmet(r, model_features))
        ]
        if not candidates:
            why = "; ".join(f"{r.name}: {r.status_line()}" for r in records) or "none installed"
            raise PluginError(f"{flag or family} auto: no available plugin here ({why})")
        return max(candidates, key=lambda r: (r.manifest.priority, _neg(r.name)))

    def auto_pick_label(self, family: str) -> str:
        """What ``auto`` means here, for listings."""
        records = self.family_records(family)
        if any(r.name == "auto" for r in records):
            return "auto (a plugin: decides from the model)"
        if FAMILIES[family].auto is None:
            return FAMILIES[family].unset
        if not records:
            return "none installed"
        try:
            return self.auto(family).name
        except PluginError:
            return "none available here"

    @staticmethod
    def _unknown_message(label: str, choice: str, records: list[PluginRecord]) -> str:
        names = sorted({r.name for r in records})
        close = difflib.get_close_matches(choice, names, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        installed = ", ".join(names) if names else "none"
        return f"unknown {label} '{choice}'; installed: {installed}{hint}"

    # ------------------------------------------------------------------ loading and hooks

    def load(self, record: PluginRecord) -> Any:
        """Import the implementation of one plugin and register it with the plugin manager."""
        if record.qualified in self._loaded:
            return self._loaded[record.qualified]
        manifest = record.manifest
        if manifest is None or manifest.implementation is None:
            raise PluginError(f"{record.qualified} ({record.distribution}): {record.reason}")
        module_name, _, attr = manifest.implementation.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in filter(None, attr.split(".")):
                obj = getattr(obj, part)
        except Exception as exc:
            raise PluginError(
                f"plugin {record.name} ({record.distribution} {record.version}) failed to load "
                f"{manifest.implementation}: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            self.pm.register(obj, name=record.qualified)
            self.pm.check_pending()
        except Exception as exc:  # pluggy.PluginValidationError, or a duplicate registration
            if self.pm.is_registered(obj):
                self.pm.unregister(obj)
            raise PluginError(
                f"plugin {record.name} ({record.distribution}) does not match the hook "
                f"specifications: {exc}"
            ) from exc
        self._loaded[record.qualified] = obj
        self._owner[id(obj)] = record
        return obj

    def call_family_hook(self, record: PluginRecord, **kwargs: Any) -> Any:
        """Call the family hook on this one plugin and return its product."""
        family = FAMILIES[record.family]
        obj = self.load(record)
        hook = getattr(self.pm.hook, family.hook)
        if not any(impl.plugin is obj for impl in hook.get_hookimpls()):
            raise PluginError(
                f"plugin {record.name} ({record.distribution}) does not implement {family.hook}"
            )
        others = [p for p in self.pm.get_plugins() if p is not obj]
        caller = self.pm.subset_hook_caller(family.hook, remove_plugins=others)
        product = caller(**kwargs)
        if product is None:
            raise NoAnswerError(f"plugin {record.name} ({record.distribution}) returned nothing "
                              f"from {family.hook}")
        return product

    def create(self, family: str, choice: str, **hook_kwargs: Any) -> Any:
        """Resolve, load and call: the product of ``choice`` in ``family``."""
        return self.call_family_hook(self.resolve(family, choice), **hook_kwargs)

    def broadcast(self, hook_name: str, **kwargs: Any) -> list[Any]:
        """Call a cross-cutting hook on every loaded plugin."""
        return getattr(self.pm.hook, hook_name)(**kwargs)

    def has_impls(self, hook_name: str) -> bool:
        return bool(getattr(self.pm.hook, hook_name).get_hookimpls())

    # ------------------------------------------------------------------ tracing

    def _enable_trace(self) -> None:
        starts: list[float] = []
        tlog = logging.getLogger("engine.trace")

        def before(hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
            starts.append(time.perf_counter())

        def after(outcome: Any, hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
            ms = (time.perf_counter() - starts.pop()) * 1000
            who = ", ".join(self._describe(i.plugin) for i in reversed(impls)) or "no plugin"
            status = "raised" if outcome.exception is not None else "ok"
            tlog.warning("hook %s -> %s: %s in %.3f ms", hook_name, who, status, ms)

        self.pm.add_hookcall_monitoring(before, after)

    def _describe(self, obj: Any) -> str:
        rec = self._owner.get(id(obj))
        if rec is None:
            return self.pm.get_name(obj) or repr(obj)
        return f"{rec.qualified} ({rec.distribution} {rec.version})"


def _neg(name: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in name)
