"""Discovery, availability, conflicts, broken plugins, API versions, auto selection and hooks,
exercised with real throw-away distributions installed into this environment."""

from __future__ import annotations

import json
import logging

import pytest

from engine.assembly import Assembly
from engine.config import ServerConfig
from engine.errors import PluginError
from engine.plugins.registry import Registry
from plugin_factory import engine, install, uninstall, write_plugin

MANIFEST = """\
from engine.api import Plugin, Requires
plugin = Plugin(name={name!r}, family={family!r}, implementation={impl!r},
                description="test", priority={priority}, requires=Requires({requires}),
                api_version={api})
"""

REASONING_IMPL = """\
from engine.api import hookimpl
from engine.api.parsers import ReasoningDelta, ReasoningParser

class P(ReasoningParser):
    def parse(self, text): return ReasoningDelta(content=text)
    def feed(self, chunk): return ReasoningDelta(content=chunk)
    def finish(self): return ReasoningDelta()

@hookimpl
def engine_create_reasoning_parser(options, chat_template):
    return lambda **kw: P()
"""

BAD_HOOK_IMPL = """\
from engine.api import hookimpl

@hookimpl
def engine_create_reasoning_parser(wrong_argument):
    return None
"""

SPECS = [
    # dist, family, name, priority, requires, api, impl source
    ("engine-t-alpha", "reasoning_parser", "t_alpha", 0, "", 2, REASONING_IMPL),
    ("engine-t-dup-one", "reasoning_parser", "t_dup", 0, "", 2, REASONING_IMPL),
    ("engine-t-dup-two", "reasoning_parser", "t_dup", 0, "", 2, REASONING_IMPL),
    ("engine-t-needs-pkg", "reasoning_parser", "t_needs_pkg", 0,
     "packages=('no-such-package-xyz>=1',)", 2, REASONING_IMPL),
    ("engine-t-future", "reasoning_parser", "t_future", 0, "", 3, REASONING_IMPL),
    ("engine-t-badhook", "reasoning_parser", "t_badhook", 0, "", 2, BAD_HOOK_IMPL),
    ("engine-t-gpu", "attention", "t_gpu", 50, "devices=('cuda',), min_compute_capability=(9, 0)",
     2, ""),
    ("engine-t-npu", "attention", "t_npu", 60, "devices=('npu',), packages=('torch_npu',)", 2, ""),
    ("engine-t-needs-exe", "attention", "t_needs_exe", 0, "executables=('no-such-program-xyz',)",
     2, ""),
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    dirs = []
    for dist, fam, name, prio, req, api, impl in SPECS:
        module = dist.replace("-", "_")
        dirs.append(write_plugin(root, dist, f"engine.{fam}", name, MANIFEST.format(
            name=name, family=fam, impl=f"{module}.impl", priority=prio, requires=req, api=api),
            impl, module))
    dirs.append(write_plugin(root, "engine-t-broken", "engine.reasoning_parser", "t_broken",
                             "raise RuntimeError('boom at import')\n"))
    dirs.append(write_plugin(root, "engine-t-notplugin", "engine.tool_parser", "t_notplugin",
                             "plugin = 42\n"))
    dirs.append(write_plugin(root, "engine-t-noattr", "engine.tool_parser", "t_noattr",
                             "other = 1\n"))
    install(*dirs)
    yield root
    uninstall(*[s[0] for s in SPECS], "engine-t-broken", "engine-t-notplugin", "engine-t-noattr")


def by_name(records, name, dist=None):
    return [r for r in records if r.name == name and (dist is None or r.distribution == dist)]


def test_statuses_with_reasons(installed):
    """Every kind of plugin problem is listed with its distribution and reason; nothing breaks."""
    records = Registry().records
    assert by_name(records, "t_alpha")[0].status == "available"
    needs = by_name(records, "t_needs_pkg")[0]
    assert needs.status == "unavailable" and "needs no-such-package-xyz>=1" in needs.reason
    future = by_name(records, "t_future")[0]
    assert future.status == "incompatible" and "plugin API 3" in future.reason
    broken = by_name(records, "t_broken")[0]
    assert broken.status == "broken" and "boom at import" in broken.reason
    assert broken.distribution == "engine-t-broken"
    notplugin = by_name(records, "t_notplugin")[0]
    assert notplugin.status == "broken" and "not a Plugin" in notplugin.reason
    noattr = by_name(records, "t_noattr")[0]
    assert noattr.status == "broken" and "AttributeError" in noattr.reason
    npu = by_name(records, "t_npu")[0]
    assert npu.status == "unavailable" and "Ascend NPU" in npu.reason
    exe = by_name(records, "t_needs_exe")[0]
    assert exe.status == "unavailable" and exe.reason == "needs no-such-program-xyz on PATH"


def test_conflict_names_both_distributions(installed):
    reg = Registry()
    dups = by_name(reg.records, "t_dup")
    assert {r.status for r in dups} == {"conflict"}
    assert "engine-t-dup-one and engine-t-dup-two" in dups[0].reason
    with pytest.raises(PluginError, match="engine-t-dup-one and engine-t-dup-two"):
        reg.resolve("reasoning_parser", "t_dup")
    pinned = reg.resolve("reasoning_parser", "t_dup@engine-t-dup-two")
    assert pinned.distribution == "engine-t-dup-two"


def test_compute_capability_reason(installed, monkeypatch):
    from engine.plugins import platform

    monkeypatch.setenv("ENGINE_DEVICE", "cuda")
    monkeypatch.setenv("ENGINE_COMPUTE_CAPABILITY", "8.0")
    platform.facts.cache_clear()
    try:
        rec = by_name(Registry().records, "t_gpu")[0]
        assert rec.status == "unavailable" and rec.reason.startswith("needs SM90 or newer")
        monkeypatch.setenv("ENGINE_COMPUTE_CAPABILITY", "9.0")
        platform.facts.cache_clear()
        reg = Registry()
        assert by_name(reg.records, "t_gpu")[0].available
        assert reg.auto("attention").name == "t_gpu"  # highest available priority wins
    finally:
        platform.facts.cache_clear()


def test_auto_skips_unavailable(installed):
    reg = Registry()
    assert reg.auto("attention").name != "t_npu"  # priority 60 but unavailable here


def _build(reg: Registry, name: str, **config: object) -> object:
    assembly = Assembly(ServerConfig(**config), reg)  # type: ignore[arg-type]
    return assembly.build(reg.resolve("reasoning_parser", name), chat_template=None)


def test_hook_validation_and_calls(installed):
    reg = Registry()
    with pytest.raises(PluginError, match="does not match the hook specifications"):
        _build(reg, "t_badhook")
    factory = _build(reg, "t_alpha")
    assert factory().parse("hi").content == "hi"


def test_trace_plugins_logs_hook_calls(installed, caplog):
    reg = Registry()
    with caplog.at_level(logging.WARNING, logger="engine.trace"):
        _build(reg, "t_alpha", trace_plugins=True)
    line = next(r.getMessage() for r in caplog.records if r.name == "engine.trace")
    assert "engine_create_reasoning_parser -> reasoning_parser.t_alpha (engine-t-alpha 0.0.1)" in line
    assert line.endswith(" ms")


def test_cli_list_json_and_errors(installed):
    out = engine("plugins", "list", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    names = {(p["family"], p["name"], p["status"]) for p in data["plugins"]}
    assert ("reasoning_parser", "t_broken", "broken") in names
    assert ("reasoning_parser", "t_alpha", "available") in names
    table = engine("plugins", "list", "--family", "reasoning_parser", "--available")
    assert "t_alpha" in table.stdout and "t_broken" not in table.stdout
    refused = engine("serve", "--reasoning-parser", "t_needs_pkg")
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("needs no-such-package-xyz>=1")
    assert "Traceback" not in refused.stderr
    unknown = engine("serve", "--reasoning-parser", "t_alpah")
    assert unknown.returncode == 2 and "did you mean 't_alpha'" in unknown.stderr
    assert "installed:" in unknown.stderr
    broken = engine("serve", "--reasoning-parser", "t_broken")
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert broken.stderr.count("\n") == 1 and "engine-t-broken" in broken.stderr
    dup = engine("serve", "--reasoning-parser", "t_dup")
    assert dup.returncode == 2 and "engine-t-dup-one and engine-t-dup-two" in dup.stderr


def test_cli_show_and_check(installed):
    show = engine("plugins", "show", "t_needs_pkg")
    assert show.returncode == 0 and "engine-t-needs-pkg 0.0.1" in show.stdout
    assert "--reasoning-parser" in show.stdout
    check = engine("plugins", "check", "t_alpha")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "manifest import is cheap" in check.stdout
    bad = engine("plugins", "check", "t_badhook")
    assert bad.returncode == 1 and "does not match the hook specifications" in bad.stdout
    broken = engine("plugins", "check", "t_broken")
    assert broken.returncode == 1 and "boom at import" in broken.stdout
