"""Acceptance run of constrained decoding: every constrained output parses and validates, and
unconstrained requests running beside them are unchanged. Not a timed test.

Run from the repository root after ``./dev setup``::

    .venv/bin/python benchmarks/grammar_acceptance.py [--backends llguidance,xgrammar,outlines]
        [--requests 200] [--plain 40] [--concurrency 16]

For each backend (one server at a time, default model, CPU, torch_native attention) it sends
``--requests`` constrained requests - JSON schemas (nested objects, enums, arrays with bounds,
anyOf, string patterns, numbers with ranges), regular expressions and small EBNF grammars, on
chat, completions and ``/generate``, streamed and not, greedy and seeded sampling - all at once
(``--concurrency`` client threads), mixed with ``--plain`` unconstrained requests (greedy and
seeded). Each constrained output must end with ``stop`` and parse and validate (``jsonschema``,
``re.fullmatch``, the grammar's own checker); a kind the backend does not compile must be
refused with a 400 naming the field. The unconstrained outputs must equal those of a reference
server run with ``--grammar-backend none``. One table per backend is printed; the exit status
is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _server import free_port, stop, wait_ready  # noqa: E402

CHAT, COMPL, GEN = "/v1/chat/completions", "/v1/completions", "/generate"
MAX_TOKENS = 256

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
            "profile": {"type": "object", "properties": {
                "nick": {"type": "string", "maxLength": 12},
                "verified": {"type": "boolean"}},
                "required": ["nick", "verified"], "additionalProperties": False}},
            "required": ["id", "profile"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "enums": {"type": "object", "properties": {
        "size": {"enum": ["S", "M", "L", "XL"]},
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"enum": [1, 2, 3]}},
        "required": ["size", "color", "count"], "additionalProperties": False},
    "bounded-array": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                 "minItems": 1, "maxItems": 4},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                   "minItems": 2, "maxItems": 3}},
        "required": ["tags", "scores"], "additionalProperties": False},
    "any-of": {"type": "object", "properties": {
        "value": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5},
                            {"type": "string", "maxLength": 10}, {"type": "null"},
                            {"type": "boolean"}]}},
        "required": ["value"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
        "required": ["email", "code"], "additionalProperties": False},
    "number-range": {"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": -50, "maximum": 60},
        "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
        "unit": {"enum": ["C", "F"]}},
        "required": ["temperature", "humidity", "unit"], "additionalProperties": False},
    "array-of-objects": {"type": "array", "items": {
        "type": "object", "properties": {
            "x": {"type": "integer", "minimum": 0, "maximum": 99},
            "label": {"enum": ["a", "b"]}},
        "required": ["x", "label"], "additionalProperties": False},
        "minItems": 1, "maxItems": 3},
    "optional-fields": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 16},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "genre": {"enum": ["drama", "comedy"]}},
        "required": ["title"], "additionalProperties": False},
    "scalar": {"type": "integer", "minimum": 10, "maximum": 999},
}
REGEXES = [r"(yes|no), because [a-z ]{3,20}\.", r"[A-Z][a-z]{2,10}-[0-9]{3}",
           r"\d{4}-\d{2}-\d{2}", r"(red|green|blue)( and (red|green|blue)){0,2}",
           r"[a-z]{1,10}@[a-z]{1,8}\.com"]
#: GBNF grammars with a checker of their language each
EBNFS: list[tuple[str, Callable[[str], bool]]] = [
    ('root ::= animal " " verb " " place\nanimal ::= "cat" | "dog" | "bird"\n'
     'verb ::= "sleeps" | "runs"\nplace ::= "here" | "there" | "outside"\n',
     lambda t: re.fullmatch(r"(cat|dog|bird) (sleeps|runs) (here|there|outside)", t)
     is not None),
    ('root ::= num (" + " num)?\nnum ::= [1-9] [0-9]?\n',
     lambda t: re.fullmatch(r"[1-9][0-9]?( \+ [1-9][0-9]?)?", t) is not None),
    ('root ::= "[" item ("," item)? "]"\nitem ::= "\\"" [a-z] [a-z]? [a-z]? "\\""\n',
     lambda t: re.fullmatch(r'\["[a-z]{1,3}"(,"[a-z]{1,3}")?\]', t) is not None),
]
PROMPTS = ["Describe an example as JSON.", "Give me some data.", "Answer briefly:",
           "Write something about the weather.", "List a few things."]
PLAIN = ["The capital of France is", "def fibonacci(n):", "Water boils at",
         "Once upon a time", "The three primary colors are"]


@dataclass
class Case:
    """One request: its kind (json_schema, regex, ebnf, plain), route, body and checker."""

    kind: str
    label: str
    path: str
    body: dict[str, Any]
    stream: bool
    check: Callable[[str], bool] | None = None  #: None: compared with the reference instead
    field: str = ""  #: the constraint's field (the 400's ``param`` when refused)


def _json_ok(schema: dict[str, Any]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    return check


def _sampling(rng: random.Random) -> dict[str, Any]:
    return {"temperature": 0} if rng.random() < 0.5 else \
        {"temperature": 0.7, "seed": rng.randrange(1000)}


def constrained_cases(n: int, seed: int = 0) -> list[Case]:
    """``n`` constrained requests: about 60 % JSON schemas, 25 % regexes, 15 % grammars, over
    the three routes, streamed and not, greedy and sampled."""
    rng = random.Random(seed)
    out: list[Case] = []
    names = list(SCHEMAS)
    for i in range(n):
        r = rng.random()
        prompt = rng.choice(PROMPTS)
        samp = _sampling(rng)
        stream = rng.random() < 0.4
        if r < 0.6:
            name = names[i % len(names)]
            schema = SCHEMAS[name]
            route = rng.choice(["chat", "chat", "completions", "generate"])
            if route == "chat":
                body = {"messages": [{"role": "user", "content": f"{prompt} ({name})"}],
                        "max_tokens": MAX_TOKENS, **samp,
                        "response_format": {"type": "json_schema", "json_schema": {
                            "name": name, "schema": schema}}}
                case = Case("json_schema", name, CHAT, body, stream, field="response_format")
            elif route == "completions":
                body = {"prompt": f"{prompt} ({name}) JSON: ", "max_tokens": MAX_TOKENS,
                        **samp, "json_schema": json.dumps(schema)}
                case = Case("json_schema", name, COMPL, body, stream, field="json_schema")
            else:
                body = {"text": f"{prompt} ({name}) JSON: ", "sampling_params": {
                    "max_new_tokens": MAX_TOKENS, **samp, "json_schema": json.dumps(schema)}}
                case = Case("json_schema", name, GEN, body, False, field="json_schema")
            case.check = _json_ok(schema)
        elif r < 0.85:
            pattern = REGEXES[i % len(REGEXES)]
            if rng.random() < 0.5:
                body = {"prompt": f"{prompt} ", "max_tokens": 64, **samp, "regex": pattern}
                case = Case("regex", pattern, COMPL, body, stream, field="regex")
            else:
                body = {"text": f"{prompt} ", "sampling_params": {
                    "max_new_tokens": 64, **samp, "regex": pattern}}
                case = Case("regex", pattern, GEN, body, False, field="regex")
            case.check = lambda t, p=pattern: re.fullmatch(p, t) is not None
        else:
            grammar, check = EBNFS[i % len(EBNFS)]
            body = {"prompt": f"{prompt} ", "max_tokens": 64, **samp, "ebnf": grammar}
            case = Case("ebnf", grammar.split("\n")[0][:32], COMPL, body, stream, check,
                        field="ebnf")
        out.append(case)
    return out


def plain_cases(n: int, seed: int = 1) -> list[Case]:
    """``n`` unconstrained completions (greedy, or sampled with a seed), ``ignore_eos``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        samp = _sampling(rng)
        body = {"prompt": PLAIN[i % len(PLAIN)], "max_tokens": 24, "ignore_eos": True, **samp}
        out.append(Case("plain", PLAIN[i % len(PLAIN)], COMPL, body, rng.random() < 0.3))
    return out


@dataclass
class Result:
    case: Case
    status: int
    text: str = ""
    finish: str | None = None
    error: str = ""


def send(client: httpx.Client, case: Case) -> Result:
    """One request; its text (streamed deltas joined) and finish reason."""
    if case.stream:
        text, finish = "", None
        with client.stream("POST", case.path, json={**case.body, "stream": True}) as r:
            if r.status_code != 200:
                return Result(case, r.status_code, error=r.read().decode(errors="replace"))
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return Result(case, 500, error=json.dumps(event["error"]))
                for ch in event.get("choices", ()):
                    text += (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                    finish = ch.get("finish_reason") or finish
        return Result(case, 200, text, finish)
    r = client.post(case.path, json=case.body)
    if r.status_code != 200:
        return Result(case, r.status_code, error=r.text)
    data = r.json()
    if case.path == GEN:
        reason = data["meta_info"]["finish_reason"]
        return Result(case, 200, data["text"], (reason or {}).get("type"))
    ch = data["choices"][0]
    text = ch["message"]["content"] if case.path == CHAT else ch["text"]
    return Result(case, 200, text or "", ch["finish_reason"])


def run_all(url: str, cases: list[Case], concurrency: int) -> list[Result]:
    """Send every case at once over ``concurrency`` threads (each with its own connection)."""
    local = threading.local()

    def one(case: Case) -> Result:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, timeout=1800)
        try:
            return send(local.client, case)
        except httpx.HTTPError as exc:
            return Result(case, 0, error=f"{type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, cases))


@dataclass
class Row:
    sent: int = 0
    valid: int = 0
    invalid: int = 0
    refused: int = 0  #: a 400 naming the field: a kind the backend does not compile
    failures: list[str] = field(default_factory=list)


def judge(results: list[Result], reference: dict[int, str] | None,
          plain: list[Case]) -> dict[str, Row]:
    """Per kind (and ``plain``): how many were sent, valid, invalid, refused."""
    rows: dict[str, Row] = {}
    for res in results:
        case = res.case
        row = rows.setdefault(case.kind, Row())
        row.sent += 1
        if case.kind == "plain":
            expected = None if reference is None else reference.get(plain.index(case))
            ok = res.status == 200 and (expected is None or res.text == expected)
            why = f"differs from the reference: {res.text!r} vs {expected!r}"
        elif res.status == 400 and f'"param":"{case.field}"' in res.error.replace(" ", "") \
                and "invalid_grammar" in res.error:
            row.refused += 1
            continue
        else:
            ok = res.status == 200 and res.finish == "stop" and bool(case.check(res.text))
            why = f"status {res.status} finish {res.finish}: {(res.text or res.error)[:160]!r}"
        if ok:
            row.valid += 1
        else:
            row.invalid += 1
            row.failures.append(f"{case.kind} {case.label} ({case.path}"
                                f"{', streamed' if case.stream else ''}): {why}")
    return rows


def start(backend: str, extra: list[str]) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"grammar-acceptance-{backend}-", suffix=".log",
                                      delete=False)
    cmd = [sys.executable, "-m", "engine.cli.main", "serve", "--host", "127.0.0.1", "--port",
           str(port), "--device", "cpu", "--attention-backend", "torch_native",
           "--max-total-tokens", "16384", "--max-running-requests", "16",
           "--grammar-backend", backend, *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    return proc, f"http://127.0.0.1:{port}", log.name


def table(backend: str, rows: dict[str, Row], seconds: float) -> str:
    lines = [f"{backend} ({seconds:.0f} s)", "",
             "| kind | sent | valid | invalid | refused (400) |", "|---|---|---|---|---|"]
    for kind in ("json_schema", "regex", "ebnf", "plain"):
        r = rows.get(kind)
        if r is not None:
            label = "unconstrained, identical to reference" if kind == "plain" else kind
            lines.append(f"| {label} | {r.sent} | {r.valid} | {r.invalid} | {r.refused} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="llguidance,xgrammar,outlines")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--plain", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--extra", default="", help="more serve flags for the backends' servers "
                    "(not the reference's), space separated")
    args = ap.parse_args()
    extra = args.extra.split()
    cases = constrained_cases(args.requests)
    plain = plain_cases(args.plain)

    proc, url, log = start("none", [])
    try:
        if not wait_ready(proc, url, log):
            return 2
        ref = run_all(url, plain, args.concurrency)
    finally:
        stop(proc)
    bad = [r for r in ref if r.status != 200]
    if bad:
        print(f"reference server failed: {bad[0].error}", file=sys.stderr)
        return 2
    reference = {i: r.text for i, r in enumerate(ref)}

    failed = False
    mixed = [*cases, *plain]
    random.Random(2).shuffle(mixed)
    for backend in args.backends.split(","):
        proc, url, log = start(backend, extra)
        try:
            if not wait_ready(proc, url, log):
                return 2
            t0 = time.monotonic()
            results = run_all(url, mixed, args.concurrency)
            seconds = time.monotonic() - t0
        finally:
            stop(proc)
        rows = judge(results, reference, plain)
        print(table(backend, rows, seconds), flush=True)
        for row in rows.values():
            for f in row.failures:
                print("  FAIL", f)
            failed |= bool(row.failures)
        print(flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
