"""``engine plugins list|show|check|new``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.plugins.families import FAMILIES
from engine.plugins.platform import facts
from engine.errors import PluginError
from engine.plugins.registry import Registry


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="engine plugins", description="Installed plugins.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="every plugin, its status here, and what auto picks")
    ls.add_argument("--family", choices=list(FAMILIES))
    ls.add_argument("--available", action="store_true", help="only plugins usable here")
    ls.add_argument("--json", action="store_true", help="stable JSON for scripts")
    sh = sub.add_parser("show", help="one plugin in detail")
    sh.add_argument("name")
    sh.add_argument("--family", choices=list(FAMILIES))
    ck = sub.add_parser("check", help="run the family's conformance suite on a plugin")
    ck.add_argument("name")
    ck.add_argument("--family", choices=list(FAMILIES))
    ck.add_argument("--extra-config", metavar="JSON",
                    help="--hicache-storage-backend-extra-config to check a store with "
                         "(a JSON object or @FILE)")
    new = sub.add_parser("new", help="write a ready-to-install plugin package")
    new.add_argument("family", help=f"one of: {', '.join(FAMILIES)}")
    new.add_argument("name")
    new.add_argument("--dir", default=".", help="parent directory (default: .)")
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.action == "new":
        from engine.plugins.scaffold import write_plugin

        path = write_plugin(args.family, args.name, args.dir)
        print(f"wrote {path}\ninstall it with: pip install -e {path}")
        return 0
    registry = Registry()
    if args.action == "list":
        return _list(registry, args)
    if args.action == "show":
        return _show(registry, _one(registry, args.name, args.family))
    from engine.testing.contract import run_checks

    rec = _one(registry, args.name, args.family)
    config = None
    if args.extra_config:
        from engine.config import ServerConfig, parse_extra_config

        try:
            extra = parse_extra_config(args.extra_config)
        except ValueError as exc:
            print(f"engine plugins check: --extra-config: {exc}", file=sys.stderr)
            return 2
        config = ServerConfig(hicache_storage_backend_extra_config=extra)
    results = run_checks(registry, rec, config)
    failed = 0
    for res in results:
        print(f"{res.status.upper():5} {res.name}" + (f": {res.detail}" if res.detail else ""))
        failed += res.status == "fail"
    print(f"{rec.qualified} ({rec.distribution} {rec.version}): "
          f"{'FAILED' if failed else 'passed'} ({len(results) - failed}/{len(results)} checks)")
    return 1 if failed else 0


def _one(registry: Registry, name: str, family: str | None) -> Any:
    found = registry.find(name, family)
    if not found:
        names = sorted({r.name for r in registry.records if family in (None, r.family)})
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise PluginError(f"no installed plugin named '{name}'{hint}")
    families = sorted({r.family for r in found})
    if len(families) > 1:
        raise PluginError(f"'{name}' exists in families {', '.join(families)}; add --family")
    return found[0]


def _list(registry: Registry, args: argparse.Namespace) -> int:
    records = [r for r in registry.records if args.family in (None, r.family)
               and (r.available or not args.available)]
    families = [args.family] if args.family else list(FAMILIES)
    picks = {f: registry.auto_pick_label(f) for f in families}
    if args.json:
        json.dump({"plugin_api": 1, "platform": facts().describe(),
                   "plugins": [r.to_json() for r in records], "auto": picks}, sys.stdout, indent=1)
        print()
        return 0
    cols = ("FAMILY", "NAME", "DISTRIBUTION", "VERSION", "STATUS")
    rows = [(r.family, r.name, r.distribution, r.version, r.status_line()) for r in records]
    widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(cols[:-1])]
    line = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    print(line.format(*cols))
    for row in rows:
        print(line.format(*row))
    print(f"\nthis machine: {facts().describe()}; {sum(r.available for r in records)} of "
          f"{len(records)} listed plugins usable here")
    for f in families:
        print(f"auto for {f}: {picks[f]}")
    return 0


def _show(registry: Registry, rec: Any) -> int:
    m = rec.manifest
    fam = FAMILIES[rec.family]
    print(f"{rec.name}  ({rec.family})")
    print(f"  status:        {rec.status_line()}")
    print(f"  distribution:  {rec.distribution} {rec.version}")
    print(f"  entry point:   {fam.group}: {rec.name} = {rec.entry_point}")
    print(f"  flags served:  {', '.join(fl.flag for fl in fam.flags)}")
    print(f"  implements:    {fam.hook} -> {fam.interface.replace(':', '.')}")
    if fam.unserved:
        print(f"  not served by this build: {fam.unserved}")
    if m is None:
        return 0
    print(f"  description:   {m.description}")
    print(f"  implementation: {m.implementation or '-'}")
    print(f"  plugin API:    {m.api_version}   auto priority: {m.priority}")
    r = m.requires
    print(f"  requires:      devices={'/'.join(r.devices)}"
          + (f" packages={', '.join(r.packages)}" if r.packages else "")
          + (f" min SM{r.min_compute_capability[0]}{r.min_compute_capability[1]}"
             if r.min_compute_capability else "")
          + (f" cpu={','.join(r.cpu_features)}" if r.cpu_features else "")
          + (f" os={','.join(r.os)}" if r.os else "")
          + (f" executables={','.join(r.executables)}" if r.executables else "")
          + (f" model={','.join(r.model_features)}" if r.model_features else ""))
    if m.not_implemented:
        print(f"  not implemented on this build: {m.not_implemented}")
    for opt in m.options:
        print(f"  option {opt.flag} ({opt.type}, default {opt.default!r}): {opt.help}")
    for note in m.notes:
        print(f"  note: {note}")
    return 0
