"""The outlines plugin's numeric bounds (outlines-core ignores them): the regex of a bounded
integer matches exactly the integers in range as JSON writes them; that of a bounded number
never matches a number out of range and matches every integer in range and every decimal whose
unit interval fits; inside a whole schema the bounds hold where the placeholder stood."""

from __future__ import annotations

import json
import random
import re

import pytest

pytest.importorskip("outlines_core")
ranges = pytest.importorskip("engine_grammar_outlines.ranges")


def inside(v: float, lo, hi, lo_open=False, hi_open=False) -> bool:
    return ((lo is None or (v > lo if lo_open else v >= lo))
            and (hi is None or (v < hi if hi_open else v <= hi)))


def test_integer_ranges_match_exactly_the_integers_within() -> None:
    rng = random.Random(0)
    cases = [(0, 120), (1, 9999), (-5, 5), (1900, 2030), (10, 999), (0, 0), (-7, -3),
             (None, 5), (-12, None), (None, None), (99, 100), (1000, 1000)]
    cases += [tuple(sorted((rng.randint(-3000, 3000), rng.randint(-3000, 3000))))
              for _ in range(60)]
    for lo, hi in cases:
        rx = re.compile(ranges.int_range(lo, hi))
        for n in [*range(-3100, 3100, 3), 10**7, -10**7, lo or 0, hi or 0]:
            assert bool(rx.fullmatch(str(n))) == inside(n, lo, hi), (lo, hi, n)
        for text in ("-0", "007", "+3", "1.0", "1e3", ""):
            assert not rx.fullmatch(text), (lo, hi, text)
    with pytest.raises(ValueError):
        ranges.int_range(5, 4)


def test_number_ranges_never_leave_their_bounds() -> None:
    rng = random.Random(1)
    texts = [t for i in range(-130, 131)
             for t in (str(i), f"{i}.5", f"{i}.0", f"{i}.999", f"{i}.25")] + ["-0.5", "-0.0"]
    checked = 0
    for _ in range(300):
        lo = rng.choice([None, rng.randint(-100, 100), rng.randint(-1000, 1000) / 10])
        hi = rng.choice([None, rng.randint(-100, 100), rng.randint(-1000, 1000) / 10])
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        lo_open, hi_open = rng.random() < 0.3, rng.random() < 0.3
        try:
            rx = re.compile(ranges.number_range(lo, hi, lo_open, hi_open))
        except ValueError:  # nothing within (e.g. an open interval between two integers)
            continue
        for t in texts:
            if rx.fullmatch(t):
                assert inside(float(t), lo, hi, lo_open, hi_open), (lo, hi, lo_open, hi_open, t)
        for i in range(-130, 131):
            if inside(i, lo, hi, lo_open, hi_open):
                assert rx.fullmatch(str(i)), (lo, hi, i)
            if i >= 0 and inside(i, lo, hi, lo_open, False) and (hi is None or i + 1 <= hi):
                assert rx.fullmatch(f"{i}.5"), (lo, hi, i)
        checked += 1
    assert checked > 200


def test_bounds_hold_inside_a_whole_schema() -> None:
    schema = {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "temp": {"type": "number", "minimum": -50, "maximum": 60},
        "scores": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": 0,
                                              "exclusiveMaximum": 10}},
        "pick": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5},
                           {"type": "string", "maxLength": 3}]},
        "free": {"type": "integer"}},
        "required": ["age", "temp", "scores", "pick", "free"], "additionalProperties": False}
    rx = re.compile(ranges.bounded_regex(json.dumps(schema), None))

    def doc(**kw) -> str:
        base = {"age": 30, "temp": -12.5, "scores": [1, 9], "pick": -5, "free": 123456}
        return json.dumps({**base, **kw}, separators=(",", ":"))

    assert rx.fullmatch(doc())
    assert rx.fullmatch(doc(pick="ab", temp=60, age=0))
    for bad in (doc(age=121), doc(age=-1), doc(temp=60.5), doc(temp=-51), doc(scores=[0]),
                doc(scores=[10]), doc(pick=6), doc(pick="abcd")):
        assert not rx.fullmatch(bad), bad
    # a schema without bounds is outlines-core's own regex
    plain = json.dumps({"type": "object", "properties": {"x": {"type": "integer"}}})
    import outlines_core

    assert ranges.bounded_regex(plain, None) == \
        outlines_core.json_schema.build_regex_from_schema(plain, None)
