"""Plugin discovery through stevedore versus engine's own, on the installed plugins. Prints a table.

    .venv/bin/python -m pip install stevedore   # not a dependency of engine
    .venv/bin/python benchmarks/discovery_stevedore.py [--runs 7]

Each row runs in a fresh interpreter (median of --runs):

* ``engine discover, cache warm``: what ``engine plugins list`` does on every call after the
  first (no manifest import, no metadata scan);
* ``engine discover, cache cold``: entry points via ``importlib.metadata``, every manifest
  imported, availability computed;
* ``stevedore ExtensionManager per family``: entry points via stevedore's cache, every manifest
  loaded with a load-failure callback (no availability, no distribution names);
* the same plus the ``importlib.metadata`` scan that distribution names then need.

Then two facts about stevedore's entry points: whether they carry their distribution, and
whether a plugin installed by the running process is seen by a second ``ExtensionManager``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MODES = {
    "engine discover, cache warm": "from engine.plugins.discovery import discover; discover()",
    "engine discover, cache cold":
        "from engine.plugins.discovery import discover; discover(use_cache=False)",
    "stevedore ExtensionManager per family": textwrap.dedent("""
        from stevedore import ExtensionManager
        from engine.plugins.families import FAMILIES
        for fam in FAMILIES.values():
            list(ExtensionManager(fam.group, on_load_failure_callback=lambda *a: None))
        """),
    "stevedore + distribution names (metadata scan)": textwrap.dedent("""
        from importlib import metadata
        from stevedore import ExtensionManager
        from engine.plugins.families import FAMILIES
        groups = {f.group for f in FAMILIES.values()}
        owners = {(ep.group, ep.name): d.metadata["Name"] for d in metadata.distributions()
                  for ep in d.entry_points if ep.group in groups}
        for fam in FAMILIES.values():
            for ext in ExtensionManager(fam.group, on_load_failure_callback=lambda *a: None):
                owners[(fam.group, ext.name)]
        """),
}

FACTS = textwrap.dedent("""
    import subprocess, sys
    from stevedore import ExtensionManager
    group = "engine.reasoning_parser"
    first = ExtensionManager(group)
    ep = next(iter(first)).entry_point
    print("distribution on a stevedore entry point:", getattr(ep, "dist", None))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", sys.argv[1]], check=True)
    try:
        ExtensionManager.ENTRY_POINT_CACHE.clear()
        again = ExtensionManager(group)
        print("plugin installed by this process seen by a new ExtensionManager:",
              "zz_probe" in again.names())
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y",
                        "engine-reasoning-zz-probe"], check=True)
    """)

PROBE_PYPROJECT = """\
[build-system]
requires = ["flit_core>=3.9,<4"]
build-backend = "flit_core.buildapi"
[project]
name = "engine-reasoning-zz-probe"
version = "0.0.1"
description = "probe"
[project.entry-points."engine.reasoning_parser"]
zz_probe = "engine_reasoning_zz_probe:plugin"
"""


def timed(code: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    rows = [("python -c pass", timed("pass", args.runs))]
    for label, code in MODES.items():
        timed(code, 1)  # fill each cache once
        rows.append((label, timed(code, args.runs)))
    width = max(len(r[0]) for r in rows)
    print(f"{'process (fresh interpreter)':<{width}}  ms, median of {args.runs}")
    for label, ms in rows:
        print(f"{label:<{width}}  {ms:8.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "probe"
        (pkg / "engine_reasoning_zz_probe").mkdir(parents=True)
        (pkg / "pyproject.toml").write_text(PROBE_PYPROJECT)
        (pkg / "engine_reasoning_zz_probe" / "__init__.py").write_text(
            '"""probe"""\nfrom engine.api import Plugin\n'
            'plugin = Plugin(name="zz_probe", family="reasoning_parser", implementation=None, '
            'not_implemented="probe")\n')
        subprocess.run([sys.executable, "-c", FACTS, str(pkg)], check=True)


if __name__ == "__main__":
    main()
