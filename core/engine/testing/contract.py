"""The contract checks every plugin must pass, then the family's own conformance suite.

``engine plugins check NAME`` and the test suite call :func:`run_checks`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.plugins.discovery import AVAILABLE, BROKEN, INCOMPATIBLE, PluginRecord
from engine.plugins.families import FAMILIES
from engine.errors import PluginError
from engine.plugins.registry import Registry

HEAVY = ("torch", "triton", "transformers", "flashinfer", "numpy")

#: family -> keyword arguments for the family hook when a suite wants the product directly
PRODUCT_KWARGS: dict[str, dict[str, Any]] = {
    "reasoning_parser": {"chat_template": None},
    "tool_parser": {"chat_template": None},
}


@dataclass
class CheckResult:
    name: str
    status: str  # "pass", "fail", "skip"
    detail: str = ""


def manifest_import_cost(record: PluginRecord) -> list[str]:
    """Import the manifest module in a fresh interpreter; return heavy modules it pulled in."""
    module = record.entry_point.partition(":")[0]
    impl = (record.manifest.implementation or "").partition(":")[0] if record.manifest else ""
    code = (
        "import importlib, json, sys; importlib.import_module(%r); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r or m == %r)))"
        % (module, HEAVY, impl)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return [f"<import failed: {out.stderr.strip().splitlines()[-1:]}>"]
    return json.loads(out.stdout)


#: what a plugin may import of the core: the public plugin API (the plugin API version covers it)
API_PACKAGE = "engine.api"


def core_imports_outside_api(package_dir: str | Path) -> list[str]:
    """Every ``engine.*`` import outside :mod:`engine.api` in the ``.py`` files below
    ``package_dir``, as ``"file:line: module"`` (none for a plugin that keeps to the API)."""
    found = []
    for path in sorted(Path(package_dir).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
                if node.module == "engine":
                    modules = [f"engine.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                inside = module == API_PACKAGE or module.startswith(API_PACKAGE + ".")
                if (module == "engine" or module.startswith("engine.")) and not inside:
                    found.append(f"{path}:{node.lineno}: {module}")
    return found


def _package_dir(record: PluginRecord) -> str | None:
    spec = importlib.util.find_spec(record.entry_point.partition(":")[0].split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


class Product:
    """Builds the plugin's product through its family hook (``product(**hook_kwargs)``);
    ``config`` is the server config the check runs with (its options, extra configs)."""

    def __init__(self, assembly: Any, record: PluginRecord) -> None:
        self.assembly, self.record, self.config = assembly, record, assembly.config

    def __call__(self, **kwargs: Any) -> Any:
        return self.assembly.build(self.record, **kwargs)


def run_checks(registry: Registry, record: PluginRecord,
               config: Any = None) -> list[CheckResult]:
    """Every check, in order; ``config``: the :class:`~engine.config.ServerConfig` to check
    with (default: every option at its default)."""
    results: list[CheckResult] = []
    if record.status == BROKEN or record.manifest is None:
        return [CheckResult("manifest valid", "fail", record.reason)]
    results.append(CheckResult("manifest valid", "pass"))
    if record.status == INCOMPATIBLE:
        return results + [CheckResult("plugin API version", "fail", record.reason)]
    results.append(CheckResult("plugin API version", "pass"))
    heavy = manifest_import_cost(record)
    results.append(CheckResult("manifest import is cheap", "fail" if heavy else "pass",
                               f"pulled in {', '.join(heavy)}" if heavy else ""))
    package = _package_dir(record)
    outside = core_imports_outside_api(package) if package else []
    results.append(CheckResult(f"imports only {API_PACKAGE} of the core",
                               "fail" if outside else "pass", "; ".join(outside)))
    if record.status != AVAILABLE:
        results.append(CheckResult("loads", "skip", record.status_line()))
        return results
    try:
        registry.load(record)
        results.append(CheckResult("loads and matches the hook specifications", "pass"))
    except PluginError as exc:
        return results + [CheckResult("loads and matches the hook specifications", "fail",
                                      str(exc))]
    family = FAMILIES[record.family]
    hook = getattr(registry.pm.hook, family.hook)
    impl_obj = registry.load(record)
    if not any(i.plugin is impl_obj for i in hook.get_hookimpls()):
        return results + [CheckResult(f"implements {family.hook}", "fail")]
    results.append(CheckResult(f"implements {family.hook}", "pass"))
    suite = _load_suite(family.conformance)
    if suite is None:
        results.append(CheckResult("family conformance suite", "skip", "none for this family"))
        return results
    from engine.assembly import Assembly
    from engine.config import ServerConfig

    assembly = Assembly(config or ServerConfig(), registry)  # options: defaults unless set
    try:
        if record.family in PRODUCT_KWARGS:
            product: Any = assembly.build(record, **PRODUCT_KWARGS[record.family])
        else:
            product = Product(assembly, record)
        failures = suite(record.name, product)
    except Exception as exc:  # the suite reports a crashing plugin as a failure
        failures = [f"raised {type(exc).__name__}: {exc}"]
    if failures:
        results.extend(CheckResult(f"conformance: {f}", "fail") for f in failures)
    else:
        results.append(CheckResult(f"{record.family} conformance suite", "pass"))
    return results


def _load_suite(ref: str) -> Callable[[str, Any], list[str]] | None:
    module, _, attr = ref.partition(":")
    if module == "engine.testing.contract" or importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), attr)
