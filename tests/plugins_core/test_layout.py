"""Plugins import only the public plugin API (``engine.api``) of the core, and pin the core."""

from __future__ import annotations

from pathlib import Path

from engine.plugins.scaffold import core_requirement
from engine.testing.contract import core_imports_outside_api

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIRS = sorted(p.parent for p in ROOT.glob("plugins/*/*/pyproject.toml"))


def test_every_in_tree_plugin_imports_only_the_api():
    assert len(PLUGIN_DIRS) > 100
    outside = [v for d in PLUGIN_DIRS for v in core_imports_outside_api(d)]
    assert outside == []


def test_a_plugin_importing_core_internals_is_caught(tmp_path):
    pkg = tmp_path / "engine_attention_sneaky"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from engine.api import Plugin\n")
    (pkg / "impl.py").write_text(
        "import engine.runtime.scheduler\n"
        "from engine import config\n"
        "from engine.api.attention import KVPool\n"
        "from engine.parsers.reasoning import take_until\n")
    found = core_imports_outside_api(tmp_path)
    assert [f.rsplit(": ", 1)[1] for f in found] == [
        "engine.runtime.scheduler", "engine.config", "engine.parsers.reasoning"]
    assert all(f.startswith(str(pkg / "impl.py")) for f in found)


def test_every_plugin_pins_the_core_range():
    unpinned = [d.name for d in PLUGIN_DIRS
                if f'"{core_requirement()}"' not in (d / "pyproject.toml").read_text()]
    assert unpinned == []
