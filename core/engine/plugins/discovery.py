"""Find every installed plugin and say whether it can run here, without importing implementations.

Discovery reads entry points of the family groups and imports only each plugin's manifest module.
Availability is computed from cheap facts (installed distributions, device kind, compute
capability, CPU flags, OS, API version). A plugin whose manifest cannot be read is recorded as
broken with its distribution and error; nothing else is affected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from engine.plugins import cache_dir
from engine.plugins.families import FAMILIES, Family
from engine.plugins.manifest import PLUGIN_API_VERSION, Option, Plugin, Requires
from engine.plugins.platform import PlatformFacts, facts

AVAILABLE = "available"
UNAVAILABLE = "unavailable"
INCOMPATIBLE = "incompatible"
BROKEN = "broken"
CONFLICT = "conflict"


@dataclass
class PluginRecord:
    """One installed plugin as discovery sees it."""

    family: str
    name: str
    distribution: str
    version: str
    entry_point: str  #: ``module:attr`` of the manifest
    manifest: Plugin | None
    status: str = AVAILABLE
    reason: str = ""  #: why it is not available (empty when available)

    @property
    def available(self) -> bool:
        return self.status == AVAILABLE

    @property
    def qualified(self) -> str:
        return f"{self.family}.{self.name}"

    @property
    def emulated(self) -> bool:
        """Available, but computing a format the hardware lacks by emulation (the manifest
        says so with a note that starts ``emulated:``)."""
        notes = self.manifest.notes if self.manifest else ()
        return self.available and any(n.startswith("emulated:") for n in notes)

    def status_line(self) -> str:
        if not self.available:
            return f"{self.status}: {self.reason}"
        return f"{self.status} (emulated)" if self.emulated else self.status

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "family": self.family,
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.entry_point,
            "status": self.status,
            "reason": self.reason,
            "description": m.description if m else "",
            "priority": m.priority if m else 0,
        }


def _installed_versions() -> dict[str, str]:
    from importlib import metadata

    from packaging.utils import canonicalize_name

    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonicalize_name(name), dist.version)
    return out


class _Checker:
    """Evaluates :class:`Requires` against this machine; one per discovery run."""

    def __init__(self, platform: PlatformFacts, package_results: dict[str, str] | None = None):
        self.platform = platform
        self._versions: dict[str, str] | None = None
        #: requirement string -> unmet reason ("" when met); depends only on installed dists
        self.package_results: dict[str, str] = dict(package_results or {})

    def versions(self) -> dict[str, str]:
        if self._versions is None:
            self._versions = _installed_versions()
        return self._versions

    def unmet(self, req: Requires, model_features: frozenset[str] | None = None) -> str:
        """Return the first unmet requirement as a reason, or ``""``."""
        p = self.platform
        if req.os and p.os not in req.os:
            return f"needs OS {'/'.join(req.os)} (this is {p.os})"
        if not any(d in p.devices for d in req.devices):
            need = " or ".join(_device_words(d) for d in req.devices)
            return f"needs {need} (this machine has: {p.describe()})"
        if req.devices == ("cuda",) or ("cuda" in req.devices and "cpu" not in req.devices):
            cc = p.compute_capability
            if req.min_compute_capability and cc and cc < req.min_compute_capability:
                lo = req.min_compute_capability
                return f"needs SM{lo[0]}{lo[1]} or newer (this GPU is SM{cc[0]}{cc[1]})"
            if req.max_compute_capability and cc and cc > req.max_compute_capability:
                hi = req.max_compute_capability
                return f"needs SM{hi[0]}{hi[1]} or older (this GPU is SM{cc[0]}{cc[1]})"
        missing = [f for f in req.cpu_features if f not in p.cpu_features]
        if missing:
            return f"needs CPU features {', '.join(missing)}"
        absent = [exe for exe in req.executables if shutil.which(exe) is None]
        if absent:
            return f"needs {', '.join(absent)} on PATH"
        for spec in req.packages:
            reason = self._package_unmet(spec)
            if reason:
                return reason
        if model_features is not None:
            lacking = [f for f in req.model_features if f not in model_features]
            if lacking:
                return f"needs a model with {', '.join(lacking)}"
        return ""

    def _package_unmet(self, spec: str) -> str:
        if "|" in spec:  # alternatives: any one of them installed will do
            options = [s.strip() for s in spec.split("|")]
            if any(not self._package_unmet(o) for o in options):
                return ""
            return f"needs one of {', '.join(options)}"
        if spec not in self.package_results:
            self.package_results[spec] = self._evaluate_package(spec)
        return self.package_results[spec]

    def _evaluate_package(self, spec: str) -> str:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import canonicalize_name

        try:
            req = Requirement(spec)
        except InvalidRequirement:
            return f"bad requirement {spec!r} in manifest"
        found = self.versions().get(canonicalize_name(req.name))
        if found is None:
            return f"needs {spec}"
        if req.specifier and not req.specifier.contains(found, prereleases=True):
            return f"needs {spec} (found {found})"
        return ""


def _device_words(kind: str) -> str:
    return {
        "cuda": "a CUDA GPU", "rocm": "a ROCm GPU", "npu": "an Ascend NPU",
        "xpu": "an Intel XPU", "mps": "Apple MPS", "cpu": "a CPU",
    }.get(kind, kind)


def discover(platform: PlatformFacts | None = None, *, use_cache: bool = True) -> list[PluginRecord]:
    """Every plugin of every family, with its status. Never raises for a bad plugin.

    Results are cached in a file keyed by the modification times of every ``sys.path`` directory
    (installing or removing a distribution changes its site directory) and of every manifest
    module; a hit costs no import and no metadata scan. ``ENGINE_NO_PLUGIN_CACHE=1`` disables it.
    """
    platform = platform or facts()
    use_cache = use_cache and not os.environ.get("ENGINE_NO_PLUGIN_CACHE")
    path = _cache_path() if use_cache else None
    cached = _read_cache(path) if path else None
    if cached is not None:
        checker = _Checker(platform, cached["packages"])
        records = [_from_cache(item, checker) for item in cached["records"]]
    else:
        from importlib import metadata

        checker = _Checker(platform)
        eps = metadata.entry_points()
        records = []
        for fam in FAMILIES.values():
            for ep in eps.select(group=fam.group):
                records.append(_record(fam, ep, checker))
        if path:
            _write_cache(path, records, checker)
    _mark_conflicts(records)
    records.sort(key=lambda r: (list(FAMILIES).index(r.family), r.name, r.distribution))
    return records


def _record(fam: Family, ep: Any, checker: _Checker) -> PluginRecord:
    dist = getattr(ep, "dist", None)
    rec = PluginRecord(
        family=fam.name,
        name=ep.name,
        distribution=dist.metadata["Name"] if dist else "?",
        version=dist.version if dist else "?",
        entry_point=ep.value,
        manifest=None,
    )
    try:
        module_name, _, attr = ep.value.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
        if not isinstance(obj, Plugin):
            raise TypeError(f"entry point {ep.value} is a {type(obj).__name__}, not a Plugin")
        obj.validate()
        if obj.family != fam.name:
            raise ValueError(f"manifest family {obj.family!r} but entry-point group {fam.group}")
        if obj.name != ep.name:
            raise ValueError(f"manifest name {obj.name!r} but entry-point name {ep.name!r}")
    except Exception as exc:  # a broken plugin must not break discovery
        rec.status, rec.reason = BROKEN, f"{type(exc).__name__}: {exc}"
        return rec
    rec.manifest = obj
    _set_status(rec, checker)
    return rec


def _set_status(rec: PluginRecord, checker: _Checker) -> None:
    obj = rec.manifest
    assert obj is not None
    if obj.api_version != PLUGIN_API_VERSION:
        rec.status = INCOMPATIBLE
        rec.reason = f"built for plugin API {obj.api_version}, this core has {PLUGIN_API_VERSION}"
    elif obj.not_implemented:
        rec.status, rec.reason = UNAVAILABLE, f"not implemented on this build: {obj.not_implemented}"
    else:
        unmet = checker.unmet(obj.requires)
        if unmet:
            rec.status, rec.reason = UNAVAILABLE, unmet


def _mark_conflicts(records: list[PluginRecord]) -> None:
    by_key: dict[tuple[str, str], list[PluginRecord]] = {}
    for r in records:
        by_key.setdefault((r.family, r.name), []).append(r)
    for group in by_key.values():
        dists = sorted({r.distribution for r in group})
        if len(dists) > 1:
            for r in group:
                r.status = CONFLICT
                r.reason = (
                    f"'{r.name}' is registered in family {r.family} by {' and '.join(dists)}; "
                    f"uninstall one, or pin one as '{r.name}@<distribution>'"
                )


def model_unmet(record: PluginRecord, model_features: frozenset[str]) -> str:
    """Re-check a plugin's model requirements once the model is known."""
    if record.manifest is None:
        return record.reason
    lacking = [f for f in record.manifest.requires.model_features if f not in model_features]
    return f"needs a model with {', '.join(lacking)}" if lacking else ""


# --------------------------------------------------------------------------- cache


def _cache_path() -> str | None:
    tag = hashlib.sha1(f"{sys.prefix}|{sys.version}|{PLUGIN_API_VERSION}".encode()).hexdigest()
    return os.path.join(cache_dir(), f"plugins-{tag[:16]}.json")


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _path_key() -> list[list[Any]]:
    # sys.path[0] is the script's folder or the working directory: not where plugins live
    return [[p, _mtime(p)] for p in sys.path[1:] if p and os.path.isdir(p)]


def _read_cache(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if data.get("paths") != _path_key():
        return None
    if any(_mtime(f) != m for f, m in data.get("files", [])):
        return None
    return data


def _write_cache(path: str, records: list[PluginRecord], checker: _Checker) -> None:
    files = []
    for rec in records:
        module = sys.modules.get(rec.entry_point.partition(":")[0])
        f = getattr(module, "__file__", None)
        if f:
            files.append([f, _mtime(f)])
    data = {
        "paths": _path_key(),
        "files": files,
        "packages": checker.package_results,
        "records": [_to_cache(r) for r in records],
    }
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs speed


def _to_cache(rec: PluginRecord) -> dict[str, Any]:
    item = {k: getattr(rec, k) for k in ("family", "name", "distribution", "version",
                                         "entry_point", "status", "reason")}
    item["manifest"] = dataclasses.asdict(rec.manifest) if rec.manifest else None
    return item


def _from_cache(item: dict[str, Any], checker: _Checker) -> PluginRecord:
    m = item.pop("manifest")
    rec = PluginRecord(**item, manifest=None)
    if m is not None:
        req = {k: tuple(v) if isinstance(v, list) else v for k, v in m.pop("requires").items()}
        opts = tuple(Option(**{k: tuple(v) if isinstance(v, list) else v for k, v in o.items()})
                     for o in m.pop("options"))
        rec.manifest = Plugin(**{k: tuple(v) if isinstance(v, list) else v for k, v in m.items()},
                              requires=Requires(**req), options=opts)
        rec.status, rec.reason = AVAILABLE, ""
        _set_status(rec, checker)  # platform facts may differ from when the cache was written
    return rec
