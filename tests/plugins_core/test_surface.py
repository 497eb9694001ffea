"""The reference option surface of ``engine serve``: every option known, one status each, the
generated table and docs up to date, and not-yet options refused with their reason."""

from __future__ import annotations

import fnmatch
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import surface
from engine.cli.args import build_parser, parse_config
from engine.errors import ConfigError
from engine.plugins.registry import Registry
from plugin_factory import engine

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_HELP = Path("/work/shared/reference/serve-help.txt")
TABLE = surface.surface()
REGISTRY = Registry()


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_option_has_one_status_and_every_rule_is_used():
    flags = [o.flag for o in TABLE]
    assert len(flags) == len(set(flags))
    assert all(o.status in surface.STATUSES for o in TABLE)
    assert all(o.reason for o in TABLE if o.status != surface.IMPLEMENTED)
    assert set(surface.ACCEPTED) <= set(flags)
    assert set(surface.PLUGIN_OPTIONS) <= set(flags)
    unused = [pat for pats in surface.NOT_YET.values() for pat in pats
              if not any(fnmatch.fnmatchcase(o.flag, pat) for o in TABLE)]
    assert not unused
    counts = surface.counts()
    assert sum(counts[s] for s in surface.STATUSES) == counts["total"] == len(TABLE)


def test_plugin_options_of_the_reference_are_the_manifests():
    declared = {opt.flag: rec.qualified for rec in REGISTRY.records if rec.manifest
                for opt in rec.manifest.options}
    assert {f: q for f, q in declared.items() if f in surface.PLUGIN_OPTIONS} == \
        surface.PLUGIN_OPTIONS


@pytest.mark.parametrize("opt", TABLE, ids=lambda o: o.flag)
def test_every_reference_option_parses_with_its_default(opt):
    known = {s for a in build_parser(REGISTRY)._actions for s in a.option_strings}
    assert set(opt.spellings) <= known
    argv = [] if opt.default in (None, False) else [opt.flag, str(opt.default)]
    parse_config(argv, REGISTRY)


def _non_default(opt: surface.RefOption) -> list[str]:
    if opt.kind in ("switch", "negatable", "optional"):
        return [opt.flag]
    if opt.choices:
        return [opt.flag, next(c for c in opt.choices if c != opt.default)]
    return [opt.flag, "7"]


@pytest.mark.parametrize("opt", [o for o in TABLE if o.status == surface.NOT_YET_STATUS],
                         ids=lambda o: o.flag)
def test_not_yet_options_are_refused_with_their_reason(opt):
    with pytest.raises(ConfigError) as err:
        parse_config(_non_default(opt), REGISTRY)
    assert str(err.value).startswith(opt.flag) and opt.reason in str(err.value)


CHOICES = [(o, c) for o in TABLE if o.status in (surface.IMPLEMENTED, surface.FAMILY)
           for c in o.choices]


@pytest.mark.parametrize("opt,choice", CHOICES, ids=[f"{o.flag}={c}" for o, c in CHOICES])
def test_every_reference_choice_of_a_served_option_parses_or_is_refused_with_a_reason(opt,
                                                                                      choice):
    """A choice the reference lists is never an argparse 'invalid choice': it is served, or
    refused (exit 2) saying why (an unserved choice, a plugin not installed or unavailable)."""
    try:
        config = parse_config([opt.flag, choice], REGISTRY)
    except ConfigError as exc:
        message = str(exc)
        assert "invalid choice" not in message and opt.flag in message, message
        if opt.status == surface.IMPLEMENTED:
            assert message.startswith(f"{opt.flag} {choice}: not supported yet: ")
            assert surface.UNSERVED_CHOICES[opt.flag] in message
        return
    served = {str(v) for v in vars(config).values() if not isinstance(v, (dict, tuple))}
    for values in (config.plugin_options or {}).values():  # a plugin's own options
        served |= {str(v) for v in values.values()}
    assert choice in served


def test_every_unserved_choice_rule_is_used():
    from engine.cli.args import unserved_choices
    from engine.config import core_fields, flag_of

    used = {flag_of(f) for f in core_fields() if unserved_choices(f)}
    assert used == set(surface.UNSERVED_CHOICES)


def test_refusal_is_one_line_and_exit_status_2():
    flag = "--prefill-kv-cache-dequant-dtype"
    out = engine("serve", flag, "fp8_e4m3")
    assert out.returncode == 2
    assert out.stderr.strip() == (f"engine serve: error: {flag} fp8_e4m3: not "
                                  "supported yet: " + surface.not_yet_reason(flag))


def test_accepted_options_are_recorded_and_held_to_their_values(tmp_path):
    config = parse_config(["--tp-size", "1", "--trust-remote-code", "--revision", "main",
                           "--enable-metrics"], REGISTRY)
    assert dict(config.accepted) == {"--tp-size": 1, "--trust-remote-code": True,
                                     "--revision": "main", "--enable-metrics": True}
    with pytest.raises(ConfigError, match=r"^--tp-size 2: only 1 is supported: one server"):
        parse_config(["--tensor-parallel-size", "2"], REGISTRY)
    with pytest.raises(ConfigError, match="not supported yet"):
        yaml = tmp_path / "c.yaml"
        yaml.write_text("tp-size: 1\nprefill_kv_cache_dequant_dtype: fp8_e4m3\n")
        parse_config(["--config", str(yaml)], REGISTRY)


def test_unknown_flag_names_the_closest():
    with pytest.raises(ConfigError, match=r"^unknown option '--stream-intervall'; did you mean "
                                          r"'--stream-interval'\?$"):
        parse_config(["--stream-intervall", "2"], REGISTRY)


def test_help_shows_the_served_options_and_help_all_everything():
    short = engine("serve", "--help").stdout
    full = engine("serve", "--help-all").stdout
    assert "--stream-interval" in short and "--help-all" in short
    assert "--kv-cache-dtype" in short  # served
    assert "--prefill-kv-cache-dequant-dtype" not in short and "--tp-size" not in short
    assert "--prefill-kv-cache-dequant-dtype" in full and "not yet:" in full and "accepted:" in full


def test_list_options_parse_to_tuples():
    config = parse_config(["--cuda-graph-bs-decode", "1", "2", "8"], REGISTRY)
    assert config.cuda_graph_bs_decode == (1, 2, 8)


@pytest.mark.skipif(not REFERENCE_HELP.exists(), reason="the reference help text is not here")
def test_generated_option_table_is_current():
    gen = _tool("gen_reference_options")
    text = gen.render(gen.parse(REFERENCE_HELP.read_text(encoding="utf-8")))
    assert gen.TARGET.read_text(encoding="utf-8") == text, \
        "run python tools/gen_reference_options.py"


def test_flags_doc_is_current():
    doc = _tool("gen_flags_doc")
    assert doc.TARGET.read_text(encoding="utf-8") == doc.render(), \
        "run python tools/gen_flags_doc.py"


def test_serve_help_imports_no_option_table_for_plugins_list():
    code = ("import sys; from engine.cli.main import main; main(['plugins', 'list']); "
            "print('engine.cli.reference_options' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stderr.strip().splitlines()[-1] == "False"
