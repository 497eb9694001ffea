"""Cost of constrained decoding on CPU with the default model. One script.

Run from the repository root after ``./dev setup``::

    .venv/bin/python benchmarks/grammar.py [--backend llguidance] [--steps 48]

(a) mask time per token: for one JSON schema, the time to fill a row's bitmask (the library)
    and to apply it to a float32 logits row (the core), token by token along greedy walks
    through the schema; p50 and p99 in microseconds;
(b) decode step time at batch 1 and 8: the median wall time of a scheduler decode step with
    every request unconstrained, and with every request constrained by the schema (ignore_eos,
    the same prompts), the masks computed inline (after the forward) and overlapped with it
    (the default), in alternating rounds; the difference is what the grammar costs a step;
(c) compile time of a large JSON schema (``large_schema``: 40 tools' worth of nested objects,
    enums, bounded arrays, anyOf, patterns and numeric ranges) for each backend of
    ``--compile-backends``: the cold compile (a fresh variant of the schema each round, so no
    library cache helps), the first mask of a new matcher, and a hit in the engine's compiled
    grammar cache; median and max over rounds, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 6},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string",
                                                         "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "tags", "address"]}
ROUNDS = 3
PROMPT = "Describe a person as JSON with name, age, tags and address:"


def large_schema(variant: int = 0, tools: int = 40) -> dict:
    """A large schema: ``{"calls": [anyOf of ``tools`` tool-call objects]}``, each tool with
    nested objects, enums, bounded strings and arrays, numeric ranges and a pattern; property
    names carry ``variant`` so each variant compiles from scratch."""
    calls = []
    for t in range(tools):
        args = {
            f"query_{variant}": {"type": "string", "maxLength": 64},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100 + t},
            "unit": {"enum": ["celsius", "fahrenheit", "kelvin", f"u{t}"]},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 16},
                     "minItems": 0, "maxItems": 5},
            "when": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "filter": {"type": "object", "properties": {
                "field": {"type": "string"},
                "op": {"enum": ["eq", "ne", "lt", "gt"]},
                "value": {"anyOf": [{"type": "string"}, {"type": "integer"},
                                    {"type": "boolean"}, {"type": "null"}]}},
                "required": ["field", "op", "value"]},
        }
        calls.append({"type": "object", "properties": {
            "name": {"const": f"tool_{t}"},
            "arguments": {"type": "object", "properties": args,
                          "required": [f"query_{variant}", "limit", "filter"]}},
            "required": ["name", "arguments"]})
    return {"type": "object", "properties": {
        "calls": {"type": "array", "items": {"anyOf": calls}, "minItems": 1, "maxItems": 4}},
        "required": ["calls"]}


def compile_times(engine, names: list[str], tools: int, rounds: int = 5, budget: float = 30.0):
    """Yields (backend, build s, cold compile s, first mask s, cache hit s) per backend, the
    last three over ``rounds`` rounds (fewer once the cold compiles passed ``budget`` seconds);
    a backend that is not installed or cannot compile the schema yields (backend, why)."""
    import dataclasses

    from engine.api.grammar import GrammarSpec, allocate_token_bitmask
    from engine.assembly import Assembly
    from engine.runtime.grammar import Grammars

    rt = engine.runtime
    for name in names:
        try:
            cfg = dataclasses.replace(rt.config, grammar_backend=name)
            t0 = time.perf_counter()
            backend = Assembly(cfg).grammar_backend(rt.tokenizer, rt.vocab_size)
            build = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported in the table
            yield name, f"unavailable: {type(exc).__name__}: {exc}"
            continue
        grammars = Grammars(backend)
        cold, first, hit = [], [], []
        try:
            for r in range(rounds):
                if sum(cold) > budget:
                    break
                spec = GrammarSpec("json_schema",
                                   json.dumps(large_schema(variant=r + 1, tools=tools)))
                t0 = time.perf_counter()
                compiled = grammars.compiled(spec)
                t1 = time.perf_counter()
                m = backend.matcher(compiled)
                m.fill_bitmask(allocate_token_bitmask(1, rt.vocab_size), 0)
                t2 = time.perf_counter()
                grammars.compiled(spec)
                t3 = time.perf_counter()
                cold.append(t1 - t0)
                first.append(t2 - t1)
                hit.append(t3 - t2)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            yield name, f"failed: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        finally:
            grammars.shutdown()
        yield name, build, cold, first, hit


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def mask_times(backend, vocab: int, walks: int = 8, steps: int = 64) -> tuple[list, list]:
    from engine.api.grammar import GrammarSpec, allocate_token_bitmask, \
        apply_token_bitmask_inplace

    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    fill, apply = [], []
    gen = torch.Generator().manual_seed(0)
    for _ in range(walks):
        m = backend.matcher(compiled)
        bitmask = allocate_token_bitmask(1, vocab)
        for _ in range(steps):
            logits = torch.randn(1, vocab, generator=gen)
            t0 = time.perf_counter()
            m.fill_bitmask(bitmask, 0)
            t1 = time.perf_counter()
            apply_token_bitmask_inplace(logits[0], bitmask[0])
            t2 = time.perf_counter()
            fill.append(t1 - t0)
            apply.append(t2 - t1)
            tok = int(logits.argmax())
            if not m.accept(tok) or m.is_terminated():
                break
    return fill, apply


def decode_steps(engine, backend, batch: int, steps: int, constrained: bool,
                 overlap: bool = True) -> list[float]:
    """Seconds of each decode step of ``batch`` greedy requests (all constrained or none; the
    masks overlapped with the forward or computed inline)."""
    from engine.api.grammar import GrammarSpec
    from engine.runtime.sampling import SamplingParams

    sched = engine.runtime.scheduler
    sched.masks.enabled = overlap
    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    ids = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0.0, max_new_tokens=steps, ignore_eos=True).validate()
    reqs = []
    for i in range(batch):
        grammars = [backend.matcher(compiled)] if constrained else None
        reqs += engine.runtime.make_reqs(f"b{batch}-{constrained}-{i}", ids, params,
                                         lambda out: None, grammars=grammars)
    sched.submit(reqs)
    times = []
    while sched.has_work:
        decoding = bool(sched.running) and not sched.waiting and sched.chunked is None
        t0 = time.perf_counter()
        sched.step()
        if decoding:
            times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llguidance")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model-path", default=None,
                    help="default: the default model; on a GPU machine, a directory with the "
                         "default model's config and tokenizer and --load-format dummy")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--compile-backends", default="llguidance,xgrammar,outlines",
                    help="backends of part (c), comma-separated")
    ap.add_argument("--tools", type=int, default=40, help="part (c)'s schema: tools in it")
    ap.add_argument("--parts", default="abc", help="which parts to run (a, b, c)")
    args = ap.parse_args()

    from engine import Engine

    engine = Engine(device=args.device, model_path=args.model_path, load_format=args.load_format,
                    attention_backend="torch_native" if args.device == "cpu" else "triton",
                    max_total_tokens=8192, max_running_requests=8, grammar_backend=args.backend)
    print(f"device {args.device}, model {engine.runtime.model_config.model_path}")
    backend = engine.runtime.grammars.backend
    vocab = engine.runtime.vocab_size
    print(f"backend {args.backend}, vocabulary {vocab}, torch threads {torch.get_num_threads()}")
    if "c" in args.parts:
        size = len(json.dumps(large_schema(tools=args.tools)))
        print(f"(c) compile of a JSON schema of {args.tools} tools ({size} characters), "
              "median / max over the rounds (ms):")
        print("| backend | backend build | rounds | cold compile | first mask | cache hit |")
        print("|---|---|---|---|---|---|")
        for row in compile_times(engine, args.compile_backends.split(","), args.tools):
            if len(row) == 2:
                print(f"| {row[0]} | {row[1]} | | | | |", flush=True)
                continue
            name, build, *series = row
            cells = [f"{statistics.median(s) * 1e3:.1f} / {max(s) * 1e3:.1f}" for s in series]
            print(f"| {name} | {build * 1e3:.0f} | {len(series[0])} | " + " | ".join(cells)
                  + " |", flush=True)
    if "a" in args.parts:
        report_masks(backend, vocab)
    if "b" in args.parts:
        report_steps(engine, backend, args.steps)
    return 0


def report_masks(backend, vocab: int) -> None:
    fill, apply = mask_times(backend, vocab)
    print(f"(a) mask per token over {len(fill)} tokens (us): fill p50 "
          f"{percentile(fill, .5) * 1e6:.0f} p99 {percentile(fill, .99) * 1e6:.0f}; apply p50 "
          f"{percentile(apply, .5) * 1e6:.0f} p99 {percentile(apply, .99) * 1e6:.0f}")
    sys.stdout.flush()


def report_steps(engine, backend, steps: int) -> None:
    print(f"(b) decode step (ms), median over {ROUNDS} alternating rounds:")
    for batch in (1, 8):
        decode_steps(engine, backend, batch, 8, constrained=True)  # warm-up
        modes = {"unconstrained": (False, True), "inline": (True, False),
                 "overlapped": (True, True)}
        times: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(ROUNDS):
            for mode, (constrained, overlap) in modes.items():
                times[mode] += decode_steps(engine, backend, batch, steps, constrained,
                                            overlap)
        med = {m: statistics.median(t) * 1e3 for m, t in times.items()}
        print(f"    batch {batch}: unconstrained {med['unconstrained']:.1f}, constrained "
              f"inline {med['inline']:.1f} ({med['inline'] - med['unconstrained']:+.1f}), "
              f"overlapped {med['overlapped']:.1f} "
              f"({med['overlapped'] - med['unconstrained']:+.1f})")


if __name__ == "__main__":
    sys.exit(main())
