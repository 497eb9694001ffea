"""Build and install throw-away plugin distributions, exactly as a third party would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

UV = str(Path(sys.executable).with_name("uv"))


def write_plugin(root: Path, dist: str, group: str, name: str, manifest: str,
                 impl: str = "", module: str | None = None) -> Path:
    """A flit package ``dist`` whose entry point ``name`` in ``group`` is ``<module>:plugin``."""
    module = module or dist.replace("-", "_")
    d = root / dist
    (d / module).mkdir(parents=True)
    (d / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["flit_core>=3.9,<4"]
        build-backend = "flit_core.buildapi"
        [project]
        name = "{dist}"
        version = "0.0.1"
        description = "test plugin"
        dependencies = []
        [project.entry-points."{group}"]
        "{name}" = "{module}:plugin"
        """))
    (d / module / "__init__.py").write_text(textwrap.dedent(manifest))
    if impl:
        (d / module / "impl.py").write_text(textwrap.dedent(impl))
    return d


def install(*dirs: Path) -> None:
    args = [UV, "pip", "install", "-q", "--python", sys.executable, "--no-build-isolation",
            "--no-deps"]
    for d in dirs:
        args += [str(d)]
    subprocess.run(args, check=True)


def uninstall(*dists: str) -> None:
    subprocess.run([UV, "pip", "uninstall", "-q", "--python", sys.executable, *dists],
                   check=False)


def engine(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run the ``engine`` CLI in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "engine.cli.main", *args], capture_output=True,
                          text=True, env=env, input=stdin, timeout=300)
