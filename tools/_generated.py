"""Shared by the generators in this folder: write a generated file, or check it is current."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(target: Path, text: str, *, check: bool, command: str) -> int:
    """With ``check``: 1 (saying to run ``command``) when ``target`` differs from ``text``, else
    0. Without: write ``text`` to ``target``; 0."""
    if check:
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            print(f"{target} is stale: run {command}", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}")
    return 0
