"""Start-up and set-up cost of the plugin system, with the repository's plugins and with N extra
throw-away plugin distributions installed. Prints a table.

    .venv/bin/python benchmarks/plugin_scale.py [--extra 200] [--runs 5]

Measures, median of --runs:
* ``python -c pass`` (the floor), ``engine plugins list`` and ``engine serve --help``, with the
  discovery cache warm and cold (``ENGINE_NO_PLUGIN_CACHE=1``);
* the install step of ``./dev setup`` (uv, editable, no build isolation) for the N extra
  packages, and the same with pip for comparison (on a tenth of them, extrapolated);
* the same listing timings with the N extra plugins installed. They are uninstalled at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
UV = str(Path(PY).with_name("uv"))
ENGINE = str(Path(PY).with_name("engine"))

MANIFEST = '''from engine.api import Plugin
plugin = Plugin(name="{name}", family="reasoning_parser", implementation="{mod}.impl",
                description="throw-away plugin {i}")
'''


def timed(cmd: list[str], runs: int, env: dict | None = None) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       env=env)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def generate(root: Path, n: int) -> list[Path]:
    dirs = []
    for i in range(n):
        name = f"bench_{i:03d}"
        mod = f"engine_reasoning_bench_{i:03d}"
        d = root / f"reasoning-{name}"
        (d / mod).mkdir(parents=True)
        (d / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["flit_core>=3.9,<4"]\n'
            'build-backend = "flit_core.buildapi"\n[project]\n'
            f'name = "engine-reasoning-{name}"\nversion = "0.1.0"\ndescription = "bench"\n'
            f'dependencies = []\n[project.entry-points."engine.reasoning_parser"]\n'
            f'{name} = "{mod}:plugin"\n')
        (d / mod / "__init__.py").write_text(MANIFEST.format(name=name, mod=mod, i=i))
        dirs.append(d)
    return dirs


def listing_rows(label: str, runs: int) -> list[tuple[str, float]]:
    cold = dict(os.environ, ENGINE_NO_PLUGIN_CACHE="1")
    subprocess.run([ENGINE, "plugins", "list"], stdout=subprocess.DEVNULL, check=True)  # warm
    return [
        (f"engine plugins list ({label}, cache warm)", timed([ENGINE, "plugins", "list"], runs)),
        (f"engine plugins list ({label}, cache cold)",
         timed([ENGINE, "plugins", "list"], runs, cold)),
        (f"engine serve --help ({label}, cache warm)",
         timed([ENGINE, "serve", "--help"], runs)),
    ]


def count_plugins() -> int:
    out = subprocess.run([ENGINE, "plugins", "list", "--json"], capture_output=True, text=True,
                         check=True).stdout
    import json

    return len(json.loads(out)["plugins"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    rows: list[tuple[str, float]] = [("python -c pass", timed([PY, "-c", "pass"], args.runs))]
    base = count_plugins()
    rows += listing_rows(f"{base} plugins", args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = generate(Path(tmp), args.extra)
        dists = [f"engine-reasoning-bench-{i:03d}" for i in range(args.extra)]
        t = time.perf_counter()
        subprocess.run([UV, "pip", "install", "-q", "--python", PY, "--no-build-isolation",
                        "--no-deps", *sum((["-e", str(d)] for d in dirs), [])], check=True)
        rows.append((f"install {args.extra} editable plugins (uv, no isolation)",
                     (time.perf_counter() - t) * 1000))
        total = count_plugins()
        rows += listing_rows(f"{total} plugins", args.runs)
        subprocess.run([UV, "pip", "uninstall", "-q", "--python", PY, *dists], check=True)
        sample = dirs[: max(1, args.extra // 10)]
        t = time.perf_counter()
        subprocess.run([PY, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        *sum((["-e", str(d)] for d in sample), [])], check=True,
                       stderr=subprocess.DEVNULL)
        pip_ms = (time.perf_counter() - t) * 1000 * args.extra / len(sample)
        rows.append((f"install {args.extra} editable plugins (pip, no isolation; extrapolated "
                     f"from {len(sample)})", pip_ms))
        subprocess.run([PY, "-m", "pip", "uninstall", "-q", "-y",
                        *dists[: len(sample)]], check=True, stderr=subprocess.DEVNULL)
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  ms (median of {args.runs})")
    for label, ms in rows:
        print(f"{label:<{width}}  {ms:9.1f}")


if __name__ == "__main__":
    main()
