"""``engine``: serve, plugins, parse. Every user-facing error is one line and exit status 2."""

from __future__ import annotations

import logging
import sys

USAGE = """usage: engine <command> [options]

commands:
  serve       serve a model over an OpenAI-compatible HTTP API
  plugins     list, show, check or create plugins (engine plugins --help)
  parse       run reasoning/tool-call parsers over a raw model output on stdin

engine <command> --help for the options of a command."""


def _debug(argv: list[str]) -> bool:
    for i, a in enumerate(argv):
        if a == "--log-level" and i + 1 < len(argv):
            return argv[i + 1] == "debug"
        if a == "--log-level=debug":
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    from engine.errors import EngineError

    try:
        if command == "serve":
            from engine.cli.serve import run

            return run(rest)
        if command == "plugins":
            from engine.cli.plugins_cmd import run

            return run(rest)
        if command == "parse":
            import argparse

            from engine.cli import parse_cmd

            p = argparse.ArgumentParser(prog="engine parse",
                                        description="Parse a raw model output read on stdin.")
            parse_cmd.add_arguments(p)
            return parse_cmd.run(p.parse_args(rest))
    except EngineError as exc:
        if _debug(rest):
            raise
        print(f"engine {command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"engine: unknown command '{command}'\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
