"""Numeric bounds for outlines-core, which ignores ``minimum``/``maximum`` (and the exclusive
forms) when it turns a JSON schema into a regex.

:func:`bounded_regex` replaces each bounded ``integer``/``number`` node of a schema by a unique
string constant, lets outlines-core build the regex of that schema, and substitutes the
constant's regex with one that matches exactly the JSON numbers within the bounds:

* ``integer``: every integer in the range, written as JSON writes it (no leading zeros, no
  ``-0``);
* ``number``: the integers in the range, and decimals ``n.ddd`` whose whole interval between
  two consecutive integers lies within the bounds (a subset: decimals next to a non-integer
  bound, and exponents, are not produced). An empty set is an invalid schema.
"""
from __future__ import annotations

import json
import math
from typing import Any

import outlines_core

_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_MARK = "\u2063engine-number-{}\u2063"  #: a constant no schema holds (invisible separators)


def int_range(lo: int | None, hi: int | None) -> str:
    """A regex matching exactly the JSON integers ``lo <= n <= hi`` (None: unbounded); an
    empty range raises ValueError."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"no integer in [{lo}, {hi}]")
    alts: list[str] = []
    if lo is None or lo < 0:  # negatives: -m for m in [max(1, -hi), -lo]
        m_lo = 1 if hi is None or hi >= 0 else -hi
        m_hi = None if lo is None else -lo
        alts.append("-(" + "|".join(_nonneg(m_lo, m_hi)) + ")")
    if hi is None or hi >= 0:
        alts += _nonneg(max(0, lo) if lo is not None else 0, hi)
    return "(" + "|".join(alts) + ")"


def _nonneg(a: int, b: int | None) -> list[str]:
    """Alternatives matching the integers ``a <= n <= b`` (``0 <= a``; b None: unbounded)."""
    out: list[str] = []
    digits_a = len(str(a))
    top = b if b is not None else 10 ** digits_a - 1
    for d in range(digits_a, len(str(top)) + 1):
        lo = max(a, 10 ** (d - 1) if d > 1 else 0)
        hi = min(top, 10 ** d - 1)
        if lo <= hi:
            out += _same_length(str(lo), str(hi))
    if b is None:  # every integer with more digits
        out.append(f"[1-9][0-9]{{{digits_a},}}")
    return out


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives matching the digit strings from ``lo`` to ``hi`` (same length)."""
    if lo == hi:
        return [lo]
    i = next(k for k in range(len(lo)) if lo[k] != hi[k])
    prefix, rest = lo[:i], len(lo) - i - 1
    if rest == 0:
        return [f"{prefix}[{lo[i]}-{hi[i]}]"]
    out: list[str] = []
    first, last = int(lo[i]), int(hi[i])
    if lo[i + 1:] != "0" * rest:  # lo's own leading digit, with a tail from lo's up
        out += [prefix + lo[i] + t for t in _same_length(lo[i + 1:], "9" * rest)]
        first += 1
    tail: list[str] = []
    if hi[i + 1:] != "9" * rest:  # hi's leading digit, with a tail up to hi's
        tail = [prefix + hi[i] + t for t in _same_length("0" * rest, hi[i + 1:])]
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        out.append(f"{prefix}{digit}[0-9]{{{rest}}}")
    return out + tail


def number_range(lo: float | None, hi: float | None, lo_open: bool = False,
                 hi_open: bool = False) -> str:
    """A regex matching JSON numbers within the bounds (see the module docstring)."""
    alts: list[str] = []

    def above(x: float, is_open: bool) -> int:  # the least integer allowed by lower bound x
        return math.floor(x) + 1 if is_open and x == math.floor(x) else math.ceil(x)

    def below(x: float, is_open: bool) -> int:  # the greatest integer allowed by upper bound x
        return math.ceil(x) - 1 if is_open and x == math.ceil(x) else math.floor(x)

    k_lo = None if lo is None else above(lo, lo_open)
    k_hi = None if hi is None else below(hi, hi_open)
    if k_lo is None or k_hi is None or k_lo <= k_hi:  # whole numbers
        alts.append(int_range(k_lo, k_hi))
    # n.ddd (n >= 0) lies in [n, n + 1): n itself allowed, n + 1 <= hi
    p_lo = 0 if lo is None else max(0, above(lo, lo_open))
    p_hi = None if hi is None else math.floor(hi) - 1
    if p_hi is None or p_lo <= p_hi:
        alts.append("(" + "|".join(_nonneg(p_lo, p_hi)) + r")\.[0-9]+")
    # -m.ddd (m >= 0) lies in (-(m + 1), -m]: -(m + 1) >= lo, -m allowed
    m_hi = None if lo is None else math.floor(-lo) - 1
    m_lo = 0 if hi is None else max(0, -below(hi, hi_open))
    if m_hi is None or (m_hi >= 0 and m_lo <= m_hi):
        alts.append("-(" + "|".join(_nonneg(m_lo, m_hi)) + r")\.[0-9]+")
    if not alts:
        raise ValueError(f"no number within the bounds {lo}, {hi}")
    return "(" + "|".join(alts) + ")"


def _node_regex(node: dict[str, Any]) -> str:
    lo, hi = node.get("minimum"), node.get("maximum")
    lo_open = hi_open = False
    ex_lo, ex_hi = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if isinstance(ex_lo, (int, float)) and not isinstance(ex_lo, bool) and (
            lo is None or ex_lo >= lo):
        lo, lo_open = ex_lo, True
    if isinstance(ex_hi, (int, float)) and not isinstance(ex_hi, bool) and (
            hi is None or ex_hi <= hi):
        hi, hi_open = ex_hi, True
    for name, value in (("minimum", lo), ("maximum", hi)):
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, (int, float))):
            raise ValueError(f"{name} must be a number, got {value!r}")
    if node["type"] == "integer":
        k_lo = None if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
        k_hi = None if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
        return int_range(k_lo, k_hi)
    return number_range(lo, hi, lo_open, hi_open)


def _replace(node: Any, found: dict[str, str]) -> Any:
    """``node`` with each bounded integer/number node replaced by a constant (its regex in
    ``found``)."""
    if isinstance(node, list):
        return [_replace(item, found) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") in ("integer", "number") and any(k in node for k in _BOUNDS) \
            and not {"enum", "const"} & node.keys():
        mark = _MARK.format(len(found))
        found[mark] = _node_regex(node)
        return {"const": mark}
    return {key: (value if key in ("enum", "const", "default", "examples")
                  else _replace(value, found)) for key, value in node.items()}


def bounded_regex(schema_text: str, whitespace: str | None) -> str:
    """outlines-core's regex of the JSON schema ``schema_text``, numeric bounds enforced."""
    schema = json.loads(schema_text)
    found: dict[str, str] = {}
    rewritten = _replace(schema, found)
    if not found:
        return outlines_core.json_schema.build_regex_from_schema(schema_text, whitespace)
    regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(rewritten), whitespace)
    for mark, number in found.items():
        literal = outlines_core.json_schema.build_regex_from_schema(json.dumps({"const": mark}))
        if literal not in regex:  # (an array writes its item's regex twice)
            raise ValueError("outlines-core wrote a numeric bound's placeholder in an "
                             "unexpected form")
        regex = regex.replace(literal, number)
    return regex
