"""Build ``engine serve``'s argument parser from the config fields and the installed plugins,
and turn parsed arguments (plus ``--config`` YAML) into the frozen :class:`ServerConfig`."""

from __future__ import annotations

import argparse
import json
from types import MappingProxyType
from typing import Any

from engine.assembly import refuse_unserved
from engine.config import ServerConfig, convert_value, core_fields, flag_of
from engine.plugins.families import family_for_flag
from engine.plugins.manifest import Option
from engine.errors import ConfigError, PluginError
from engine.plugins.registry import Registry

_OPTION_TYPES = {"str": str, "int": int, "float": float, "json": json.loads, "bool": None}


def build_parser(registry: Registry, prog: str = "engine serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve a model over an OpenAI-compatible "
                                "HTTP API.", allow_abbrev=False)
    p.add_argument("--config", help="YAML file of options (keys: flag names without dashes); "
                   "command-line flags override it.")
    core = p.add_argument_group("server options")
    fam_flags = family_for_flag()
    for f in core_fields():
        if f.metadata.get("family"):
            continue
        kw: dict[str, Any] = {"dest": f.name, "help": f.metadata["help"], "default": f.default}
        if f.metadata["type"] is None:
            kw["action"] = "store_true"
        else:
            kw["type"] = f.metadata["type"]
            kw["metavar"] = f.name.upper()
        if f.metadata["choices"]:
            kw["choices"] = f.metadata["choices"]
        core.add_argument(flag_of(f), *f.metadata["aliases"], **kw)
    fams = p.add_argument_group("plugin families (choices are the installed plugins)")
    for dest, (fam, fl) in fam_flags.items():
        names = registry.choices(fam.name)
        shown = ",".join(names) if names else "none installed"
        fams.add_argument(fl.flag, dest=dest, default=fl.default, metavar="{" + shown + "}",
                          help=f"{fl.help} [{fam.name}; auto: {registry.auto_pick_label(fam.name)}]")
    seen: set[str] = {a for action in p._actions for a in action.option_strings}
    for rec in registry.records:
        if not rec.manifest or not rec.manifest.options:
            continue
        group = p.add_argument_group(f"options of {rec.qualified} ({rec.distribution})")
        for opt in rec.manifest.options:
            if opt.flag in seen:
                continue
            seen.add(opt.flag)
            group.add_argument(opt.flag, dest=_opt_dest(rec.qualified, opt), default=None,
                               **_option_kwargs(opt))
    return p


def _opt_dest(qualified: str, opt: Option) -> str:
    return f"plugin::{qualified}::{opt.dest}"


def _option_kwargs(opt: Option) -> dict[str, Any]:
    help_text = opt.help + (f" (default: {opt.default})" if opt.default is not None else "")
    if opt.type == "bool":
        return {"action": "store_true", "help": help_text}
    kw: dict[str, Any] = {"type": _OPTION_TYPES[opt.type], "help": help_text,
                          "metavar": opt.dest.upper()}
    if opt.choices:
        kw["choices"] = opt.choices
    return kw


def load_yaml(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Read ``--config``; unknown keys and wrong types raise :class:`ConfigError` naming them."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of option: value")
    by_key: dict[str, argparse.Action] = {}
    for action in parser._actions:
        for s in action.option_strings:
            by_key[s.lstrip("-")] = action
            by_key[s.lstrip("-").replace("-", "_")] = action
    out: dict[str, Any] = {}
    for key, value in data.items():
        action = by_key.get(str(key))
        if action is None or action.dest in ("help", "config"):
            raise ConfigError(f"--config {path}: unknown key '{key}'")
        conv = None if isinstance(action, argparse._StoreTrueAction) else (action.type or str)
        try:
            value = convert_value(conv, value, f"--config {path}: key '{key}'")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if action.choices and value is not None and value not in action.choices:
            raise ConfigError(f"--config {path}: key '{key}': {value!r} is not one of "
                              f"{', '.join(map(str, action.choices))}")
        out[action.dest] = value
    return out


def parse_config(argv: list[str], registry: Registry) -> ServerConfig:
    """Parse ``engine serve`` arguments into a frozen config, validating every family choice."""
    parser = build_parser(registry)
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        parser.set_defaults(**load_yaml(pre.config, parser))
    ns = vars(parser.parse_args(argv))
    ns.pop("config", None)
    plugin_options: dict[str, dict[str, Any]] = {}
    for key in [k for k in ns if k.startswith("plugin::")]:
        _, qualified, dest = key.split("::")
        plugin_options.setdefault(qualified, {})[dest] = ns.pop(key)
    for rec in registry.records:  # fill defaults of every plugin's options
        if rec.manifest:
            opts = plugin_options.setdefault(rec.qualified, {})
            for opt in rec.manifest.options:
                if opts.get(opt.dest) is None:
                    opts[opt.dest] = opt.default
    frozen = MappingProxyType({k: MappingProxyType(v) for k, v in plugin_options.items() if v})
    config = ServerConfig(**ns, plugin_options=frozen)
    refuse_unserved(config)
    for dest, (fam, fl) in family_for_flag().items():
        value = ns.get(dest)
        if value is None or value == fl.default:
            continue  # defaults (auto, none) are resolved against the model at start-up
        try:
            registry.resolve(fam.name, value, flag=fl.flag)
        except PluginError as exc:
            raise ConfigError(str(exc)) from None
    return config
