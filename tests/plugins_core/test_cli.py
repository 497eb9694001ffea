"""The CLI's cheap paths, YAML config handling, and the third-party plugin round trip."""

from __future__ import annotations

import json
import subprocess
import sys

from plugin_factory import engine

HEAVY = ("torch", "triton", "transformers", "flashinfer", "engine_attention_torch_native.impl")

PROBE = """
import json, sys
from engine.cli.main import main
try:
    main({argv!r})
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} or m in {heavy!r}
               or (m.startswith('engine_') and m.endswith('.impl')))
print(json.dumps(heavy), file=sys.stderr)
"""


def _heavy_modules(argv: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
                          capture_output=True, text=True, timeout=120)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_listing_and_help_import_no_heavy_module():
    """Discovery reads manifests only: no torch/triton/transformers, no plugin implementation."""
    for use_cache in ("", "1"):
        assert _heavy_modules(["plugins", "list"]) == []
        assert _heavy_modules(["serve", "--help"]) == []
    assert _heavy_modules(["plugins", "list", "--json"]) == []


def test_serve_help_lists_installed_choices():
    out = engine("serve", "--help")
    assert out.returncode == 0
    assert "--attention-backend" in out.stdout and "torch_native" in out.stdout
    assert "--model-config-parser" in out.stdout


def test_yaml_config_errors(tmp_path):
    bad_key = tmp_path / "a.yaml"
    bad_key.write_text("port: 8080\nattention_backnd: triton\n")
    out = engine("serve", "--config", str(bad_key))
    assert out.returncode == 2
    assert out.stderr.strip() == f"engine serve: error: --config {bad_key}: unknown key 'attention_backnd'"
    bad_type = tmp_path / "b.yaml"
    bad_type.write_text("port: eighty\n")
    out = engine("serve", "--config", str(bad_type))
    assert out.returncode == 2 and "key 'port'" in out.stderr and "Traceback" not in out.stderr
    bad_bool = tmp_path / "c.yaml"
    bad_bool.write_text("disable-radix-cache: 3\n")
    out = engine("serve", "--config", str(bad_bool))
    assert out.returncode == 2 and "key 'disable-radix-cache': expected true/false" in out.stderr
    not_yaml = tmp_path / "d.yaml"
    not_yaml.write_text("port: [1, 2\n")
    out = engine("serve", "--config", str(not_yaml))
    assert out.returncode == 2 and "not valid YAML" in out.stderr


def test_yaml_config_applies_and_cli_overrides(tmp_path):
    from engine.cli.args import parse_config
    from engine.plugins.registry import Registry

    cfg = tmp_path / "ok.yaml"
    cfg.write_text("port: 8080\npage-size: 16\ncontext_length: 2k\nattention-backend: torch_native\n")
    config = parse_config(["--config", str(cfg), "--port", "9000"], Registry())
    assert (config.port, config.page_size, config.context_length) == (9000, 16, 2000)
    assert config.attention_backend == "torch_native"


def test_unknown_family_and_command():
    out = engine("plugins", "new", "nosuchfamily", "x")
    assert out.returncode == 2 and "unknown plugin family 'nosuchfamily'" in out.stderr
    out = engine("frobnicate")
    assert out.returncode == 2 and "unknown command" in out.stderr
    out = engine("plugins", "show", "no_such_plugin_anywhere")
    assert out.returncode == 2 and "no installed plugin named" in out.stderr


def test_third_party_plugin_round_trip(tmp_path):
    """Scaffold, pip-install, list, select, check, uninstall, gone."""
    out = engine("plugins", "new", "reasoning_parser", "acme_think", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    pkg = tmp_path / "reasoning-acme_think"
    assert (pkg / "tests" / "test_conformance.py").exists()
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps"]
    subprocess.run([*pip, str(pkg)], check=True)
    try:
        listed = json.loads(engine("plugins", "list", "--json").stdout)
        mine = [p for p in listed["plugins"] if p["name"] == "acme_think"]
        assert mine and mine[0]["status"] == "available"
        assert mine[0]["distribution"] == "engine-reasoning-acme-think"
        probe = ("from engine.cli.args import parse_config; from engine.plugins.registry import "
                 "Registry; print(parse_config(['--reasoning-parser', 'acme_think'], "
                 "Registry()).reasoning_parser)")
        sel = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert sel.stdout.strip() == "acme_think", sel.stderr
        check = engine("plugins", "check", "acme_think")
        assert check.returncode == 0, check.stdout + check.stderr
        own_test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   str(pkg / "tests")], capture_output=True, text=True)
        assert own_test.returncode == 0, own_test.stdout
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y",
                        "engine-reasoning-acme-think"], check=True)
    listed = json.loads(engine("plugins", "list", "--json").stdout)
    assert not [p for p in listed["plugins"] if p["name"] == "acme_think"]
    gone = engine("serve", "--reasoning-parser", "acme_think")
    assert gone.returncode == 2 and "unknown --reasoning-parser 'acme_think'" in gone.stderr
