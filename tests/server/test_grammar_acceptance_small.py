"""A small version of ``benchmarks/grammar_acceptance.py`` on the ``main`` server (llguidance):
20 varied constrained requests (JSON schemas, regexes, grammars; chat, completions and
/generate; streamed or not) all at once with unconstrained ones, whose outputs equal what the
same server gives them alone. Every constrained output ends with ``stop`` and validates."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import grammar_acceptance as acc  # noqa: E402


def test_twenty_constrained_requests_validate_beside_unchanged_unconstrained_ones(
        main_server) -> None:
    cases = acc.constrained_cases(20, seed=5)
    plain = acc.plain_cases(6)
    assert {c.kind for c in cases} == {"json_schema", "regex", "ebnf"}
    alone = acc.run_all(main_server.url, plain, 1)
    assert all(r.status == 200 for r in alone), [r.error for r in alone]
    reference = {i: r.text for i, r in enumerate(alone)}
    results = acc.run_all(main_server.url, [*cases, *plain], 16)
    rows = acc.judge(results, reference, plain)
    failures = [f for row in rows.values() for f in row.failures]
    assert not failures, failures
    assert sum(row.valid for row in rows.values()) == len(cases) + len(plain)
