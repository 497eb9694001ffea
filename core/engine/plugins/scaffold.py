"""``engine plugins new FAMILY NAME``: write a ready-to-install plugin package.

The package has a manifest module (cheap to import), an implementation module with the family
hook, a test that runs the family's conformance suite, a README and a pyproject with the entry
point. For the parser families the implementation is a small working parser to edit; for the
other families the hook is left for the author and the manifest says so through
``not_implemented`` until it is written, so nothing unfinished is ever listed as usable.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from engine.plugins.families import FAMILIES
from engine.errors import PluginError

def core_requirement() -> str:
    """The core versions a plugin built against this one supports: this minor series (the
    plugin API of :mod:`engine.api` changes only with the minor version before 1.0)."""
    from engine import __version__

    major, minor = (int(x) for x in __version__.split(".")[:2])
    return f"engine>={major}.{minor},<{major}.{minor + 1}"


_PYPROJECT = """\
[build-system]
requires = ["flit_core>=3.9,<4"]
build-backend = "flit_core.buildapi"

[project]
name = "{dist}"
version = "0.1.0"
description = "{family} plugin '{name}' for engine"
requires-python = ">=3.10"
dependencies = ["{engine_requirement}"]

[project.entry-points."{group}"]
"{name}" = "{module}:plugin"
"""

_MANIFEST = '''\
"""Manifest of the {family} plugin '{name}'. Keep this module light: no heavy imports here."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="{name}",
    family="{family}",
    implementation="{module}.impl",
    description="TODO: one line saying what this plugin does",
    requires=Requires(devices=("cpu", "cuda")),
{extra})
'''

_IMPL_REASONING = '''\
"""A reasoning parser: text between <think> and </think> is reasoning. Edit the markers."""

from engine.api.parsers import ReasoningDelta, ReasoningParser
from engine.api import hookimpl

START, END = "<think>", "</think>"


class Parser(ReasoningParser):
    def __init__(self) -> None:
        self.buf = ""
        self.state = "start"  # start -> reasoning -> content

    def parse(self, text: str) -> ReasoningDelta:
        out = self.feed(text)
        tail = self.finish()
        return ReasoningDelta(out.reasoning + tail.reasoning, out.content + tail.content)

    def feed(self, chunk: str) -> ReasoningDelta:
        self.buf += chunk
        out = ReasoningDelta()
        while True:
            if self.state == "start":
                if self.buf.startswith(START):
                    self.buf, self.state = self.buf[len(START):], "reasoning"
                elif START.startswith(self.buf):
                    return out  # could still become the start marker
                else:
                    self.state = "content"
            elif self.state == "reasoning":
                i = self.buf.find(END)
                if i >= 0:
                    out.reasoning += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(END):], "content"
                    continue
                keep = _partial(self.buf, END)
                out.reasoning += self.buf[: len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return out
            else:
                out.content += self.buf
                self.buf = ""
                return out

    def finish(self) -> ReasoningDelta:
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            return ReasoningDelta(reasoning=rest)
        return ReasoningDelta(content=rest)


def _partial(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return lambda **request: Parser()
'''

_IMPL_TOOL = '''\
"""A tool-call parser: each line `CALL name {json}` is a call. Edit the format."""

import json

from engine.api.parsers import ToolCall, ToolCallDelta, ToolDelta, ToolParser, ToolResult
from engine.api import hookimpl

PREFIX = "CALL "


class Parser(ToolParser):
    def __init__(self, *, tools=None):
        super().__init__(tools=tools)
        self.buf = ""
        self.index = 0

    def _line(self, line: str):
        if not line.startswith(PREFIX):
            return None
        name, _, args = line[len(PREFIX):].partition(" ")
        try:
            obj = json.loads(args or "{}")
        except ValueError:
            return None
        if name not in self.tool_names or not isinstance(obj, dict):
            return None
        return ToolCall(name, json.dumps(obj, ensure_ascii=False))

    def parse(self, text: str) -> ToolResult:
        result = ToolResult()
        for line in text.splitlines(keepends=True):
            call = self._line(line.rstrip("\\n"))
            if call:
                result.calls.append(call)
            else:
                result.content += line
        return result

    def feed(self, chunk: str) -> ToolDelta:
        self.buf += chunk
        out = ToolDelta()
        while "\\n" in self.buf:
            line, self.buf = self.buf.split("\\n", 1)
            self._emit(line, "\\n", out)
        if self.buf and not (self.buf.startswith(PREFIX) or PREFIX.startswith(self.buf)):
            out.content += self.buf
            self.buf = ""
        return out

    def finish(self) -> ToolDelta:
        out = ToolDelta()
        if self.buf:
            self._emit(self.buf, "", out)
            self.buf = ""
        return out

    def _emit(self, line: str, end: str, out: ToolDelta) -> None:
        call = self._line(line)
        if call:
            out.calls.append(ToolCallDelta(self.index, call.name, call.arguments))
            self.index += 1
        else:
            out.content += line + end


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: Parser(tools=tools)
'''

_IMPL_TODO = '''\
"""Implementation of the {family} plugin '{name}'.

Implement the family hook below (its contract: engine.plugins.hookspecs.{hook}), then delete the
``not_implemented`` line of the manifest so the plugin is listed as usable.
"""

from engine.api import hookimpl


@hookimpl
def {hook}(**kwargs):
    raise NotImplementedError("{name}: {hook} is not written yet")
'''

_TEST = '''\
"""Runs engine's conformance suite for the {family} family against this plugin."""

import subprocess
import sys


def test_conformance():
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "plugins", "check", "{name}",
         "--family", "{family}"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
'''

_README = """\
# {dist}

A `{family}` plugin for engine, selected with `{flag} {name}`.

    pip install -e .
    engine plugins show {name}
    engine plugins check {name}
    pytest tests/

Edit `{module}/__init__.py` (the manifest: description, requirements, options) and
`{module}/impl.py` (the `{hook}` hook). See engine's docs/plugins.md.
"""


def write_plugin(family: str, name: str, parent: str = ".") -> Path:
    """Write the package; returns its directory."""
    if family not in FAMILIES:
        raise PluginError(f"unknown plugin family '{family}'; families: {', '.join(FAMILIES)}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise PluginError(f"bad plugin name '{name}': use letters, digits, '_', '-' and '.'")
    fam = FAMILIES[family]
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name).lower()
    module = f"engine_{fam.prefix.replace('-', '_')}{slug}"
    if keyword.iskeyword(module):
        module += "_plugin"
    dist = f"engine-{fam.prefix}{name}".replace("_", "-").replace(".", "-").lower()
    root = Path(parent) / f"{fam.folder_prefix}{name}"
    if root.exists():
        raise PluginError(f"{root} already exists")
    impl = {"reasoning_parser": _IMPL_REASONING, "tool_parser": _IMPL_TOOL}.get(family)
    extra = ""
    if impl is None:
        impl = _IMPL_TODO
        extra = f'    not_implemented="scaffold: {fam.hook} in {module}/impl.py is not written yet",\n'
    fields = dict(dist=dist, family=family, name=name, module=module, group=fam.group,
                  hook=fam.hook, flag=fam.flags[0].flag, extra=extra,
                  engine_requirement=core_requirement())
    (root / module).mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text(_PYPROJECT.format(**fields))
    (root / module / "__init__.py").write_text(_MANIFEST.format(**fields))
    (root / module / "impl.py").write_text(impl.format(**fields) if impl is _IMPL_TODO else impl)
    (root / "tests" / "test_conformance.py").write_text(_TEST.format(**fields))
    (root / "README.md").write_text(_README.format(**fields))
    return root
