"""The start-up assembly: one resolution of every family choice, each plugin's own options,
tracing of every hook call, unserved families refused, missing server dependencies named."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from engine.assembly import Assembly
from engine.cli.args import parse_config
from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.plugins.families import FAMILIES
from engine.plugins.registry import Registry
from engine.testing.contract import run_checks
from plugin_factory import engine, install, uninstall, write_plugin

MUSE = " to=self<|message|>a<|eom|><|start|>assistant to=user<|message|>b<|eot|>"
FRAMED = "<|start|>assistant to=user<|message|>b<|eot|>"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry()


def _muse_content(config: ServerConfig, registry: Registry) -> str:
    factory = Assembly(config, registry).parser_factories(None).reasoning
    return factory(chat_template_kwargs={}, reasoning_effort=None).parse(MUSE).content


def test_a_parser_option_set_on_the_command_line_reaches_the_parser(registry):
    plain = parse_config(["--reasoning-parser", "muse"], registry)
    framed = parse_config(["--reasoning-parser", "muse", "--muse-keep-user-framing"], registry)
    assert _muse_content(plain, registry) == "b"
    assert _muse_content(framed, registry) == FRAMED


def test_a_parser_option_set_in_yaml_reaches_the_parser(registry, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("reasoning-parser: muse\nmuse-keep-user-framing: true\n")
    config = parse_config(["--config", str(cfg)], registry)
    assert _muse_content(config, registry) == FRAMED


def test_options_are_the_declared_defaults_unless_set(registry):
    assembly = Assembly(ServerConfig(), registry)
    muse = registry.find("muse", "reasoning_parser")[0]
    assert dict(assembly.options(muse)) == {"muse_keep_user_framing": False}
    assert assembly.options(muse).muse_keep_user_framing is False


@pytest.mark.parametrize("how", ["flag", "yaml"])
def test_trace_plugins_logs_parser_hook_calls(tmp_path, caplog, how):
    registry = Registry()
    argv = ["--reasoning-parser", "auto", "--tool-call-parser", "hermes"]
    if how == "flag":
        argv.append("--trace-plugins")
    else:
        (tmp_path / "t.yaml").write_text("trace_plugins: true\n")
        argv += ["--config", str(tmp_path / "t.yaml")]
    config = parse_config(argv, registry)
    assert config.trace_plugins
    with caplog.at_level(logging.WARNING, logger="engine.trace"):
        factories = Assembly(config, registry).parser_factories("<think>{{ x }}</think>")
    assert factories.reasoning is not None and factories.tool is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "engine.trace"]
    # auto's hook, the hook of the parser it delegated to, and the tool parser's
    assert any(line.startswith("hook engine_create_reasoning_parser -> reasoning_parser.auto")
               for line in lines)
    assert any(line.startswith("hook engine_create_reasoning_parser -> "
                               "reasoning_parser.deepseek-r1") for line in lines)
    assert any(line.startswith("hook engine_create_tool_parser -> tool_parser.hermes")
               for line in lines)


def test_every_family_flag_is_a_config_field_from_the_family_table():
    fields = ServerConfig.__dataclass_fields__
    for fam in FAMILIES.values():
        for fl in fam.flags:
            f = fields[fl.dest]
            assert f.default == fl.default and f.metadata["family"] == fam.name
            assert f.metadata["help"] == fl.help


def test_a_family_without_a_runtime_consumer_is_refused(monkeypatch):
    """Every family is served today; a family marked unserved refuses a non-default choice with
    its reason (instead of the choice being silently ignored)."""
    import dataclasses

    from engine.assembly import refuse_unserved

    fam = dataclasses.replace(FAMILIES["hicache_storage"], unserved="no consumer in this build")
    monkeypatch.setitem(FAMILIES, "hicache_storage", fam)
    with pytest.raises(ConfigError, match="^--hicache-storage-backend file: not served by this "
                                          "build: no consumer in this build$"):
        refuse_unserved(ServerConfig(hicache_storage_backend="file"))
    refuse_unserved(ServerConfig())  # the defaults are fine


def test_speculative_algorithms_are_served_and_matched_whatever_their_case(registry):
    assert FAMILIES["speculative"].unserved is None
    config = parse_config(["--speculative-algorithm", "NGRAM"], registry)
    assert registry.resolve("speculative", config.speculative_algorithm).name == "ngram"
    with pytest.raises(ConfigError, match="unknown --speculative-algorithm 'NOPE'"):
        parse_config(["--speculative-algorithm", "NOPE"], registry)


HIDE = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "fastapi":
            raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")
sys.meta_path.insert(0, Hide())
from engine.cli.main import main
sys.exit(main(["serve", "--port", "1"]))
"""


def test_serve_without_fastapi_exits_non_zero_naming_it():
    out = subprocess.run([sys.executable, "-c", HIDE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "'fastapi' package" in out.stderr and "pip install fastapi" in out.stderr


def test_plugins_check_includes_the_api_import_rule(registry):
    results = run_checks(registry, registry.find("qwen3", "reasoning_parser")[0])
    rule = [r for r in results if r.name == "imports only engine.api of the core"]
    assert rule and rule[0].status == "pass"


def test_every_family_names_a_real_interface_and_hook():
    import importlib

    from engine.plugins import hookspecs

    for fam in FAMILIES.values():
        module, _, attr = fam.interface.partition(":")
        assert module.startswith("engine.api")
        assert isinstance(getattr(importlib.import_module(module), attr), type)
        assert callable(getattr(hookspecs, fam.hook))
    out = engine("plugins", "show", "torch_native")
    assert "engine_create_attention_backend -> engine.api.attention.AttentionBackend" in out.stdout
