"""Liquid LFM2 / LFM2.5 calls: pythonic or JSON lists with recovery rewrites (see README.md)."""
from __future__ import annotations

import keyword
import re
from typing import Any

from engine.api.parsers import parse_pythonic_calls, recover_pythonic_calls
from engine.api.parsers import TaggedBlockParser, loads_object
from engine.api import hookimpl

_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)
_ZERO_INT = re.compile(r"(?<![\w.])0+(\d)")
_KW_ARG = re.compile(r"(?<![\w.])(" + "|".join(keyword.kwlist) + r")(\s*=)(?!=)")


def _outside_strings(src: str, fn) -> str:
    """Apply ``fn`` to the parts of ``src`` outside string literals."""
    out, last = [], 0
    for m in _STRING.finditer(src):
        out.append(fn(src[last : m.start()]))
        out.append(m.group().replace("\n", "\\n").replace("\t", "\\t"))
        last = m.end()
    out.append(fn(src[last:]))
    return "".join(out)


def _repair(src: str) -> tuple[str, dict[str, str]]:
    """Escape raw newlines/tabs in strings, drop zero padding, rename keyword argument names."""
    renamed: dict[str, str] = {}

    def fix(part: str) -> str:
        part = _ZERO_INT.sub(r"\1", part)

        def kw(m: re.Match) -> str:
            alias = f"{m.group(1)}_kw_"
            renamed[alias] = m.group(1)
            return alias + m.group(2)

        return _KW_ARG.sub(kw, part)

    return _outside_strings(src, fix), renamed


def _json_list(body: str) -> list[tuple[str, Any]] | None:
    obj = loads_object('{"c": ' + body + "}")
    items = obj.get("c") if obj else None
    if not isinstance(items, list) or not items:
        return None
    calls = []
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str):
            return None
        args = it.get("arguments", it.get("parameters", {}))
        calls.append((it["name"], args))
    return calls


def parse_lfm2_body(body: str, params=None) -> list[tuple[str, Any]] | None:
    """``params(name)``: the tool's parameter names, which positional arguments take."""
    body = body.strip()
    if body.startswith("[{") or body.startswith("{"):
        return _json_list(body if body.startswith("[") else "[" + body + "]")
    calls = parse_pythonic_calls(body, params)
    if calls is not None:
        return calls
    fixed, renamed = _repair(body)
    calls = parse_pythonic_calls(fixed, params)
    if calls is None:  # string values holding their own unescaped quotes
        return recover_pythonic_calls(body)
    return [(n, {renamed.get(k, k): v for k, v in a.items()}) for n, a in calls]


class Lfm2ToolParser(TaggedBlockParser):
    start_markers = ("<|tool_call_start|>",)
    end_marker = "<|tool_call_end|>"

    def parse_body(self, body: str) -> list[tuple[str, Any]] | None:
        return parse_lfm2_body(body, self.param_names)

    def param_names(self, name: str) -> list[str]:
        props = self.tool_schema(name).get("properties")
        return list(props) if isinstance(props, dict) else []


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: Lfm2ToolParser(tools=tools)
