"""Generate ``core/engine/cli/reference_options.py`` from the reference ``serve --help`` text.

    python tools/gen_reference_options.py [HELP_TXT] [--check]

The help text has one option a paragraph: ``--flag METAVAR`` (or ``--flag {a,b}``, ``--flag X
[X ...]``, ``--flag , --no-flag``), aliases on the next line as ``, --alias METAVAR``, then the
help text. Line wrapping in the source glued a few paragraphs' first help word to the flag line
or a metavar into the help; both are undone here. ``--check`` exits 1 when the committed module
differs from what the text gives.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HELP = Path("/work/shared/reference/serve-help.txt")
TARGET = ROOT / "core" / "engine" / "cli" / "reference_options.py"
SKIP = {"--help", "--config"}  #: options every argparse parser (or the CLI itself) has

HEADER = '''"""The reference ``serve`` options, one tuple each, generated from the reference help
text by ``tools/gen_reference_options.py`` (do not edit by hand).

Each entry: ``(flag, aliases, kind, metavar, choices, default, help)``; ``kind`` is ``switch``
(no value), ``negatable`` (``--x`` / ``--no-x``), ``value`` (one value), ``list`` (one or more),
``optlist`` (zero or more) or ``optional`` (zero or one). ``help`` is the reference's first
sentence. The status of each option here is in :mod:`engine.cli.surface`.
"""

'''


def _dest_upper(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").upper()


def _paragraphs(text: str) -> list[list[str]]:
    out: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("--") and not line.startswith("--- "):
            out.append([line.rstrip()])
        elif out and line.startswith("    "):
            out[-1].append(line.strip())
    return out


def _first_sentence(text: str) -> str:
    text = re.sub(r"(\w)- (\w)", r"\1-\2", " ".join(text.split()))
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    sentence = m.group(1) if m else text
    return sentence if len(sentence) <= 200 else sentence[:197].rstrip() + "..."


def _tail(tokens: list[str], dests: set[str]) -> tuple[str, str | None, tuple[str, ...], list[str]]:
    """Parse what follows a flag name: (kind, metavar, choices, words that belong to the help)."""
    if not tokens:
        return "switch", None, (), []
    t = tokens[0]
    if t.startswith("{"):
        return "value", None, tuple(t.strip("{}").split(",")), tokens[1:]
    if t.startswith("[{"):  # [{a,b} ...]
        return "optlist", None, tuple(t.strip("[{}").split(",")), tokens[2:]
    if re.fullmatch(r"\[[A-Z0-9_]+\]", t):
        return "optional", t.strip("[]"), (), tokens[1:]
    if re.fullmatch(r"\[[A-Z0-9_]+", t) and tokens[1:2] == ["...]"]:
        return "optlist", t.strip("["), (), tokens[2:]
    if re.fullmatch(r"[A-Z0-9_]+", t) and ("_" in t or t in dests):
        if tokens[1:3] == [f"[{t}", "...]"]:
            return "list", t, (), tokens[3:]
        return "value", t, (), tokens[1:]
    return "switch", None, (), tokens


def parse(text: str) -> list[tuple]:
    entries = []
    for para in _paragraphs(text):
        head = para[0].split()
        flag, rest = head[0], head[1:]
        if flag in SKIP:
            continue
        body = " ".join(para[1:])
        aliases: list[str] = []
        kind = "switch"
        if rest[:2] == [",", f"--no-{flag[2:]}"]:  # BooleanOptionalAction
            kind, rest = "negatable", rest[2:]
            aliases.append(f"--no-{flag[2:]}")
            metavar, choices, extra = None, (), rest
        else:
            dests = {_dest_upper(flag)}
            kind, metavar, choices, extra = _tail(rest, dests)
            while body.startswith(", --"):  # aliases: ", --alias METAVAR, --alias2 METAVAR help"
                words = body[2:].split()
                aliases.append(words[0].rstrip(","))
                words = words[1:]
                if words and words[0].rstrip(",") == metavar:
                    kind = kind if kind != "switch" else "value"
                    words = words[1:]
                body = " ".join(words)
                if not body.startswith("--") and body.startswith(","):
                    continue
                if words and words[0].startswith("--") and not words[0].startswith(flag):
                    body = ", " + body
            if kind == "switch" and body.startswith((flag + " ", "[{")):  # the metavar wrapped
                words = body.split()
                kind, metavar, choices, more = _tail(words[words[0] == flag:], dests)
                body = " ".join(more)
            elif kind == "switch" and (m := re.search(re.escape(flag) + r" ([A-Z][A-Z0-9_]+) (.*)",
                                                      body)) and m.group(1) in dests:
                kind, metavar, body = "value", m.group(1), m.group(2)
        help_text = " ".join(extra) + (" " if extra else "") + body
        if extra and re.fullmatch(r"[A-Z]", extra[0]) and body[:1].islower():
            help_text = extra[0] + body  # a first letter cut from its word
        if body.startswith(", and currently"):  # a paragraph that lost its own text
            help_text = body.split(f"{flag} ", 1)[-1]
        entries.append((flag, tuple(aliases), kind, metavar, choices, _default(kind, help_text),
                        _first_sentence(help_text)))
    return entries


def _default(kind: str, help_text: str) -> object:
    if kind == "switch":
        return False
    m = re.search(r"Default is '([^']+)'", help_text)
    return m.group(1) if m else None


def render(entries: list[tuple]) -> str:
    lines = "".join(f"    {entry!r},\n" for entry in entries)
    return HEADER + "# fmt: off\nOPTIONS = (\n" + lines + ")\n"


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--check"]
    source = Path(args[0]) if args else DEFAULT_HELP
    from _generated import write_or_check  # this folder, on the path when run as a script

    return write_or_check(TARGET, render(parse(source.read_text(encoding="utf-8"))),
                          check="--check" in argv,
                          command="python tools/gen_reference_options.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
