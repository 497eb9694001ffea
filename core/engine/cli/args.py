"""Build ``engine serve``'s argument parser from the config fields, the installed plugins and the
reference option table, and turn parsed arguments (plus ``--config`` YAML) into the frozen
:class:`ServerConfig`.

``--help`` shows the config fields, the family flags and the plugin options; ``--help-all`` adds
every other reference option (:mod:`engine.cli.surface`) with its status. Those parse like the
reference's; an ``accepted`` one is recorded in ``ServerConfig.accepted`` (start-up says it
changes nothing), a ``not yet`` one set to anything but its default is refused with its reason.
Every error is a :class:`ConfigError` (one line, exit status 2); an unknown flag names the
closest known one.
"""

from __future__ import annotations

import argparse
import difflib
import json
from types import MappingProxyType
from typing import Any, NoReturn

from engine.assembly import refuse_unserved
from engine.cli import surface
from engine.config import ServerConfig, convert_value, core_fields, flag_of
from engine.plugins.families import family_for_flag
from engine.plugins.manifest import Option
from engine.errors import ConfigError, PluginError
from engine.plugins.registry import Registry

_OPTION_TYPES = {"str": str, "int": int, "float": float, "json": json.loads, "bool": None}


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are :class:`ConfigError` (one line, exit status 2)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


REF_PREFIX = "ref::"  #: dest prefix of the reference options that are no config field


def build_parser(registry: Registry, prog: str = "engine serve", *,
                 show_all: bool = False) -> argparse.ArgumentParser:
    """The ``engine serve`` parser; ``show_all`` shows the reference options that are accepted
    or not yet served (they are parsed either way)."""
    p = _Parser(prog=prog, usage=f"{prog} [options]", allow_abbrev=False,
                description="Serve a model over an OpenAI-compatible HTTP API. "
                f"{'' if show_all else 'engine serve --help-all shows every option. '}"
                "Status of every option: docs/flags.md.")
    p.add_argument("--help-all", action="help", help="show every option, with its status, and "
                   "exit")
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
            if f.metadata.get("nargs"):
                kw["nargs"] = f.metadata["nargs"]
        if f.metadata["choices"]:
            kw["choices"] = f.metadata["choices"] + unserved_choices(f)
            kw.pop("metavar", None)
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
    _add_reference_options(p, seen, show_all)
    return p


def _add_reference_options(p: argparse.ArgumentParser, seen: set[str], show_all: bool) -> None:
    """The reference options no field, family flag or installed plugin option serves."""
    groups = {status: p.add_argument_group(title) for status, title in (
        (surface.ACCEPTED_STATUS, "accepted: reference options that change nothing here"),
        (surface.FAMILY, "options of plugins that are not installed"),
        (surface.NOT_YET_STATUS, "not yet: reference options refused unless left at their "
                                 "default"))}
    for opt in surface.surface():
        if opt.status == surface.IMPLEMENTED or any(s in seen for s in opt.spellings):
            continue
        accept = surface.ACCEPTED.get(opt.flag)
        kw: dict[str, Any] = {"dest": REF_PREFIX + opt.flag, "default": opt.default,
                              "help": f"{opt.help} [{opt.status}: {opt.reason}]"
                              if show_all else argparse.SUPPRESS}
        spellings = [opt.flag, *opt.aliases]
        if opt.kind == "switch":
            kw["action"] = "store_true"
        elif opt.kind == "negatable":
            kw["action"] = argparse.BooleanOptionalAction
            spellings = [opt.flag]
        else:
            kw["type"] = accept.type if accept and accept.type else str
            kw["nargs"] = {"list": "+", "optlist": "*", "optional": "?"}.get(opt.kind)
            if opt.kind == "optional":
                kw["const"] = True
            if opt.choices:
                kw["choices"] = opt.choices
            else:
                kw["metavar"] = opt.metavar or opt.dest.upper()
        groups[opt.status].add_argument(*spellings, **kw)


def unserved_choices(f: Any) -> tuple[Any, ...]:
    """The choices the reference lists for field ``f``'s option that the field does not serve
    (converted with the field's type): they parse, and :func:`_refuse_unserved_choices` refuses
    them with :data:`surface.UNSERVED_CHOICES`' reason."""
    spellings = (flag_of(f), *f.metadata["aliases"])
    ref = next((surface.by_spelling()[s] for s in spellings if s in surface.by_spelling()), None)
    if ref is None or not f.metadata["choices"]:
        return ()
    convert = f.metadata["type"] or str
    out = []
    for choice in ref.choices:
        try:
            value = convert(choice)
        except ValueError:
            continue
        if value not in f.metadata["choices"]:
            out.append(value)
    return tuple(out)


def _refuse_unserved_choices(ns: dict[str, Any]) -> None:
    for f in core_fields():
        if f.metadata.get("family") or not f.metadata["choices"]:
            continue
        value = ns.get(f.name)
        if value is not None and value not in f.metadata["choices"] and \
                value in unserved_choices(f):
            reason = surface.UNSERVED_CHOICES.get(flag_of(f), "")
            raise ConfigError(f"{flag_of(f)} {value}: not supported yet: {reason}")


def _reference_values(ns: dict[str, Any]) -> dict[str, Any]:
    """Pop the reference options out of parsed arguments; return the accepted ones that were
    set (flag -> value); refuse a not-yet one (or a plugin option whose plugin is missing) set
    to anything but its default, and an accepted one outside its accepted values."""
    by_flag = {o.flag: o for o in surface.surface()}
    accepted: dict[str, Any] = {}
    for key in [k for k in ns if k.startswith(REF_PREFIX)]:
        value = ns.pop(key)
        opt = by_flag[key[len(REF_PREFIX):]]
        if value is None or value == opt.default:
            continue
        shown = value if not isinstance(value, list) else " ".join(map(str, value))
        where = opt.flag if value is True else f"{opt.flag} {shown}"
        if opt.status == surface.ACCEPTED_STATUS:
            values = surface.ACCEPTED[opt.flag].values
            if values and value not in values:
                only = ", ".join(map(str, values))
                raise ConfigError(f"{where}: only {only} is supported: {opt.reason}")
            accepted[opt.flag] = value
        elif opt.status == surface.FAMILY:
            raise ConfigError(f"{where}: {opt.reason}, which is not installed")
        else:
            raise ConfigError(f"{where}: not supported yet: {opt.reason}")
    return accepted


def _refuse_unknown(extras: list[str], parser: argparse.ArgumentParser) -> None:
    """Raise :class:`ConfigError` for the first unknown flag, naming the closest known one."""
    known = [s for a in parser._actions for s in a.option_strings]
    for arg in extras:
        flag = arg.split("=", 1)[0]
        if flag.startswith("-"):
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown option '{flag}'{hint}")
    raise ConfigError(f"unexpected argument '{extras[0]}'")


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
        where = f"--config {path}: key '{key}'"
        switch = isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction))
        conv = None if switch else (action.type or str)
        try:
            if action.nargs in ("+", "*") and isinstance(value, list):
                value = [convert_value(conv, v, where) for v in value]
            else:
                value = convert_value(conv, value, where)
                if action.nargs in ("+", "*") and value is not None:
                    value = [value]
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for v in value if isinstance(value, list) else [value]:
            if action.choices and v is not None and v not in action.choices:
                raise ConfigError(f"{where}: {v!r} is not one of "
                                  f"{', '.join(map(str, action.choices))}")
        out[action.dest] = value
    return out


def parse_config(argv: list[str], registry: Registry) -> ServerConfig:
    """Parse ``engine serve`` arguments into a frozen config, validating every family choice."""
    parser = build_parser(registry, show_all="--help-all" in argv)
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        parser.set_defaults(**load_yaml(pre.config, parser))
    parsed, extras = parser.parse_known_args(argv)
    if extras:
        _refuse_unknown(extras, parser)
    ns = vars(parsed)
    ns.pop("config", None)
    accepted = _reference_values(ns)
    _refuse_unserved_choices(ns)
    for f in core_fields():
        if f.metadata.get("nargs") and isinstance(ns.get(f.name), list):
            ns[f.name] = tuple(ns[f.name])
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
    config = ServerConfig(**ns, plugin_options=frozen, accepted=MappingProxyType(accepted))
    refuse_unserved(config)
    if config.completion_template is not None:
        from engine.models.completion_templates import load_completion_template

        load_completion_template(config.completion_template)
    if config.hicache_storage_backend is not None and not config.enable_hierarchical_cache:
        raise ConfigError(f"--hicache-storage-backend {config.hicache_storage_backend}: needs "
                          "--enable-hierarchical-cache")
    for dest, (fam, fl) in family_for_flag().items():
        value = ns.get(dest)
        if value is None or value == fl.default:
            continue  # defaults (auto, none) are resolved against the model at start-up
        try:
            registry.resolve(fam.name, value, flag=fl.flag)
        except PluginError as exc:
            raise ConfigError(str(exc)) from None
    return config
