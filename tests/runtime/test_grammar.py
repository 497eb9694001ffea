"""Constrained decoding without a server: the conformance kit over every installed grammar
plugin, the bitmask helpers, the sampler's masking, the compile cache, and the scheduler with
the default model (valid JSON, termination, a dead end failing its request alone)."""

from __future__ import annotations

import json
import math
import re
import threading

import jsonschema
import pytest
import torch

from engine.api.grammar import (GrammarMatcher, GrammarSpec, InvalidGrammar,
                                allocate_token_bitmask, allowed_tokens,
                                apply_token_bitmask_inplace)
from engine.assembly import Assembly
from engine.config import ServerConfig
from engine.plugins.discovery import AVAILABLE
from engine.plugins.registry import Registry
from engine.runtime.grammar import GrammarDeadEnd, Grammars
from engine.runtime.sampling import Sampler, SamplingParams
from engine.testing import grammar as kit
from engine.testing.contract import run_checks
from forced_call_tools import TOOLS

#: what the conformance kit finds in each library's current release (the plugins work around
#: xgrammar's control characters in length-bounded strings and outlines' numeric bounds)
KNOWN: dict[str, str] = {}


def grammar_plugins() -> list[str]:
    return sorted(r.name for r in Registry().records
                  if r.family == "grammar" and r.status == AVAILABLE)


@pytest.mark.parametrize("name", grammar_plugins())
def test_every_grammar_plugin_passes_its_checks(name, request) -> None:
    if name in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[name], strict=True))
    registry = Registry()
    results = run_checks(registry, registry.resolve("grammar", name))
    failed = [f"{r.name}: {r.detail}" for r in results if r.status == "fail"]
    assert not failed, failed


def test_the_kit_fails_a_backend_that_lies_about_its_mask() -> None:
    class Loose(GrammarMatcher):  # allows every token, accepts them all
        def fill_bitmask(self, bitmask, index):
            bitmask[index] = -1

        def accept(self, token):
            return True

        def is_terminated(self):
            return False

    class LooseBackend(kit.GrammarBackend):
        name, kinds = "loose", ("regex",)

        def compile(self, spec):
            self.check_kind(spec)
            if spec.text == kit.INVALID["regex"]:
                raise InvalidGrammar("bad regex")
            return spec

        def matcher(self, compiled):
            return Loose()

    failures = kit.check("loose", lambda **kw: LooseBackend())
    assert failures and all("allows every token" in f for f in failures), failures


# ---------------------------------------------------------------------- bitmasks


def test_bitmask_helpers_agree_with_a_reference_on_every_path() -> None:
    vocab = 100
    allowed = [[0, 5, 31, 32, 99], [], list(range(40, 70))]
    bitmask = torch.zeros(3, (vocab + 31) // 32, dtype=torch.int32)
    for row, ids in enumerate(allowed):
        for t in ids:
            bitmask[row, t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(
                torch.int32)
    for row, ids in enumerate(allowed):
        assert allowed_tokens(bitmask[row], vocab) == ids
    logits = torch.randn(3, vocab)
    expected = torch.full_like(logits, -math.inf)
    for row, ids in enumerate(allowed):
        expected[row, ids] = logits[row, ids]
    fast = logits.clone()  # float32 CPU: the NumPy path
    apply_token_bitmask_inplace(fast, bitmask)
    generic = logits.double()  # another dtype: the torch path (as on a GPU)
    apply_token_bitmask_inplace(generic, bitmask)
    assert torch.equal(fast, expected)
    assert torch.equal(generic.float(), expected)
    one = logits[1:2].clone()  # one row at a time, as the sampler does
    apply_token_bitmask_inplace(one[0], bitmask[1])
    assert torch.isinf(one).all()
    assert allocate_token_bitmask(2, vocab).eq(-1).all()


# ---------------------------------------------------------------------- the sampler


class Fixed(GrammarMatcher):
    """Allows a fixed set of tokens at every step."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def fill_bitmask(self, bitmask, index):
        bitmask[index] = 0
        for t in self.ids:
            bitmask[index, t // 32] |= torch.tensor(1 << (t % 32)).to(torch.int32)

    def accept(self, token):
        return token in self.ids

    def is_terminated(self):
        return False


class Row:
    def __init__(self, grammar=None, **sp) -> None:
        self.sampling_params = SamplingParams(**sp).validate()
        self.generator = None if self.sampling_params.is_greedy else \
            torch.Generator().manual_seed(1)
        self.origin_input_ids, self.output_ids = [1, 2], []
        self.stop_ids, self.grammar = frozenset(), grammar


def test_the_sampler_masks_constrained_rows_alone_and_reports_dead_ends() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 300)
    rows = [Row(temperature=0.0, logprobs=True, top_logprobs=5),
            Row(Fixed([7, 200]), temperature=0.0, logprobs=True, top_logprobs=5),
            Row(Fixed([3, 4, 5]), temperature=0.9, seed=3),
            Row(Fixed([]), temperature=0.0)]
    out = Sampler()(logits.clone(), rows)
    assert out.token_ids[0] == int(logits[0].argmax())
    assert out.token_ids[1] == (7 if logits[1, 7] > logits[1, 200] else 200)
    assert out.token_ids[2] in (3, 4, 5)
    assert isinstance(out.errors.get(3), GrammarDeadEnd), out.errors
    assert set(out.errors) == {3}
    # log-probabilities of the constrained distribution; alternatives only among the allowed
    lp = torch.log_softmax(logits[1, [7, 200]], -1)
    assert out.logprobs[1] == pytest.approx(float(lp.max()), abs=1e-5)
    assert sorted(t for t, _ in out.top_logprobs[1]) == [7, 200]
    assert len(out.top_logprobs[0]) == 5
    # the unconstrained row is exactly what it is alone
    alone = Sampler()(logits[:1].clone(), rows[:1])
    assert alone.token_ids[0] == out.token_ids[0]
    assert alone.logprobs[0] == out.logprobs[0] and alone.top_logprobs == out.top_logprobs[:1]


# ---------------------------------------------------------------------- the compile cache


class Counting(kit.GrammarBackend):
    name, kinds = "counting", ("regex",)

    def __init__(self) -> None:
        self.compiled = 0

    def compile(self, spec):
        self.check_kind(spec)
        self.compiled += 1
        return object()

    def matcher(self, compiled):
        return Fixed([1])


def test_compiled_grammars_are_cached_by_spec_with_an_lru_bound() -> None:
    backend = Counting()
    grammars = Grammars(backend, cache_size=2)
    a, b, c = (GrammarSpec("regex", x) for x in "abc")
    first = grammars.compiled(a)
    assert grammars.compiled(a) is first and backend.compiled == 1
    grammars.compiled(b)
    grammars.compiled(a)  # a is now the most recent
    grammars.compiled(c)  # evicts b
    assert backend.compiled == 3
    assert grammars.compiled(a) is first
    grammars.compiled(b)
    assert backend.compiled == 4
    with pytest.raises(InvalidGrammar, match="does not support ebnf"):
        grammars.compiled(GrammarSpec("ebnf", "root ::= 'a'"))
    grammars.shutdown()


def test_a_backend_factory_runs_once_on_first_use_and_its_failure_is_reported() -> None:
    import asyncio
    import threading

    from engine.runtime.grammar import GrammarUnavailable

    calls = []

    def factory():
        calls.append(threading.current_thread().name)
        return Counting()

    grammars = Grammars(factory=factory, name="--grammar-backend counting")
    assert calls == []  # nothing built at start-up
    matchers = asyncio.run(grammars.matchers(GrammarSpec("regex", "a"), 2))
    assert len(matchers) == 2 and len(calls) == 1
    assert calls[0].startswith("engine-grammar")  # built in the compile pool, off the loop
    assert asyncio.run(grammars.loaded()) is grammars.backend and len(calls) == 1
    grammars.shutdown()

    def broken():
        calls.append("broken")
        raise RuntimeError("no vocabulary")

    failing = Grammars(factory=broken, name="--grammar-backend counting")
    for _ in range(2):
        with pytest.raises(GrammarUnavailable, match="counting failed to start: "
                                                     "RuntimeError: no vocabulary"):
            asyncio.run(failing.matchers(GrammarSpec("regex", "a"), 1))
    assert calls.count("broken") == 1  # not retried on every request
    failing.shutdown()


# ---------------------------------------------------------------------- with the model

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    "coastal": {"type": "boolean"}},
    "required": ["city", "population", "coastal"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine_and_backend():
    from _default_model import default_runner
    from engine import Engine

    engine = Engine(runner=default_runner())
    backend = Assembly(ServerConfig()).grammar_backend(engine.runtime.tokenizer,
                                                       engine.runtime.vocab_size)
    return engine, backend


def run(engine, prompt: str, grammar=None, **sp):
    outs = []
    params = SamplingParams(**{"temperature": 0.0, "max_new_tokens": 60, **sp}).validate()
    ids = engine.tokenizer.encode(prompt)
    req, = engine.runtime.make_reqs(f"g{id(outs)}", ids, params, outs.append,
                                    grammars=[grammar] if grammar else None)
    engine.runtime.scheduler.submit([req])
    return req, outs


def drain(engine) -> None:
    for _ in range(2000):
        if not engine.runtime.scheduler.step():
            return
    pytest.fail("the scheduler did not go idle")


@pytest.mark.slow
def test_constrained_requests_decode_valid_output_beside_unconstrained_ones(
        engine_and_backend) -> None:
    engine, backend = engine_and_backend
    plain_prompt = "The capital of France is"
    _, solo = run(engine, plain_prompt, max_new_tokens=12, ignore_eos=True)
    drain(engine)
    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    regex = backend.compile(GrammarSpec("regex", r"[A-Z][a-z]{2,8}, [0-9]{4}"))
    runs = [run(engine, "Describe Lisbon as JSON:", backend.matcher(compiled)),
            run(engine, plain_prompt, max_new_tokens=12, ignore_eos=True),
            run(engine, "A city and a year:", backend.matcher(regex), ignore_eos=True),
            run(engine, "Describe Oslo as JSON:", backend.matcher(compiled), temperature=0.8,
                seed=5)]
    drain(engine)
    texts = ["".join(o.text for o in outs) for _, outs in runs]
    for i in (0, 3):
        assert runs[i][1][-1].finish_reason["type"] == "stop", runs[i][1][-1]
        jsonschema.validate(json.loads(texts[i]), SCHEMA)
    assert re.fullmatch(r"[A-Z][a-z]{2,8}, [0-9]{4}", texts[2]), texts[2]
    # the regex ends the request though eos is ignored: the matcher terminated
    assert runs[2][1][-1].finish_reason == {"type": "stop"}
    assert [t for o in runs[1][1] for t in o.token_ids] == \
        [t for o in solo for t in o.token_ids]


class DeadAfter(GrammarMatcher):
    """Allows anything for ``n`` tokens, then nothing."""

    def __init__(self, n: int) -> None:
        self.n = n

    def fill_bitmask(self, bitmask, index):
        bitmask[index] = -1 if self.n > 0 else 0

    def accept(self, token):
        self.n -= 1
        return True

    def is_terminated(self):
        return False


@pytest.mark.slow
def test_a_dead_end_ends_its_request_alone_with_abort(engine_and_backend) -> None:
    engine, _ = engine_and_backend
    plain = "Once upon a time"
    _, solo = run(engine, plain, max_new_tokens=8, ignore_eos=True)
    drain(engine)
    dead, dead_outs = run(engine, "Hello", DeadAfter(3), ignore_eos=True)
    _, outs = run(engine, plain, max_new_tokens=8, ignore_eos=True)
    drain(engine)
    last = dead_outs[-1]
    assert last.finished and last.finish_reason["type"] == "abort"
    assert "grammar allows no next token after 3 generated tokens" in \
        last.finish_reason["message"]
    assert last.completion_tokens == 3
    assert [t for o in outs for t in o.token_ids] == [t for o in solo for t in o.token_ids]


class Recording(GrammarMatcher):
    """Wraps a matcher; records the name of each thread that filled a mask."""

    def __init__(self, inner: GrammarMatcher, threads: list[str]) -> None:
        self.inner, self.threads = inner, threads

    def fill_bitmask(self, bitmask, index):
        self.threads.append(threading.current_thread().name)
        self.inner.fill_bitmask(bitmask, index)

    def accept(self, token):
        return self.inner.accept(token)

    def is_terminated(self):
        return self.inner.is_terminated()


def _mix(engine, backend, threads: list[str]) -> list[tuple[list[int], dict]]:
    """A batch of constrained (schema greedy and sampled, a terminating regex, a dead end) and
    unconstrained requests; each request's tokens and finish reason."""
    schema = backend.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    regex = backend.compile(GrammarSpec("regex", r"[A-Z][a-z]{2,8}, [0-9]{4}"))
    runs = [run(engine, "Describe Lisbon as JSON:", Recording(backend.matcher(schema), threads)),
            run(engine, "The capital of France is", max_new_tokens=12, ignore_eos=True),
            run(engine, "A city and a year:", Recording(backend.matcher(regex), threads),
                ignore_eos=True),
            run(engine, "Describe Oslo as JSON:", Recording(backend.matcher(schema), threads),
                temperature=0.8, seed=5),
            run(engine, "Hello", DeadAfter(4), ignore_eos=True)]
    drain(engine)
    return [([t for o in outs for t in o.token_ids], outs[-1].finish_reason)
            for _, outs in runs]


@pytest.mark.slow
def test_masks_computed_during_the_forward_give_the_same_outputs_as_inline_ones(
        engine_and_backend) -> None:
    engine, backend = engine_and_backend
    masks = engine.runtime.scheduler.masks
    assert masks.enabled, "overlap is the default"
    ahead: list[str] = []
    overlapped = _mix(engine, backend, ahead)
    masks.enabled = False
    try:
        inline: list[str] = []
        assert _mix(engine, backend, inline) == overlapped
    finally:
        masks.enabled = True
    assert [r["type"] for _, r in overlapped] == ["stop", "length", "stop", "stop", "abort"], \
        overlapped
    # every mask but each request's first was computed by the worker; none inline when off
    assert sum(name.startswith("engine-grammar-mask") for name in ahead) >= len(ahead) - 3
    assert not any(name.startswith("engine-grammar-mask") for name in inline)


class Gate(GrammarMatcher):
    """Allows anything; its ``n``-th mask blocks until ``release`` is set."""

    def __init__(self, n: int) -> None:
        self.n, self.fills = n, 0
        self.entered, self.release = threading.Event(), threading.Event()

    def fill_bitmask(self, bitmask, index):
        self.fills += 1
        if self.fills == self.n:
            self.entered.set()
            self.release.wait(120)  # a guard only: the test sets it
        bitmask[index] = -1

    def accept(self, token):
        return True

    def is_terminated(self):
        return False


@pytest.mark.slow
def test_aborting_a_request_whose_mask_is_in_flight_never_waits_for_it(
        engine_and_backend) -> None:
    engine, _ = engine_and_backend
    sched = engine.runtime.scheduler
    gate = Gate(3)  # mask 1 is filled inline (first token), masks 2 and 3 ahead
    gated, gated_outs = run(engine, "Hello", gate, ignore_eos=True, max_new_tokens=40)
    _, solo = run(engine, "Once upon a time", max_new_tokens=8, ignore_eos=True)
    while len(gated.output_ids) < 2:  # the step that accepts token 2 submits mask 3
        assert sched.step()
    assert gate.entered.wait(60), "the worker never started the third mask"
    assert gated.grammar_mask is not None and not gated.grammar_mask.future.done()
    sched.abort([gated])  # taken at the start of the next step, before any forward
    _, outs = run(engine, "Once upon a time", max_new_tokens=8, ignore_eos=True)
    drain(engine)  # would hang if anything joined the blocked mask
    assert not gate.release.is_set() and not gated.grammar_mask.future.done()
    assert gated_outs[-1].finish_reason["type"] == "abort", gated_outs[-1]
    assert len(gated.output_ids) == 2
    assert outs[-1].finished and [t for o in outs for t in o.token_ids] == \
        [t for o in solo for t in o.token_ids]
    gate.release.set()
    gated.grammar_mask.future.result()  # the worker is free again for the next requests


@pytest.mark.slow
@pytest.mark.parametrize("parser", ["hermes", "qwen25", "llama3", "mistral", "pythonic"])
@pytest.mark.parametrize("forced", ["", "get_time"])
def test_a_forced_tool_choice_decodes_a_valid_call_in_the_parsers_format(
        engine_and_backend, parser, forced) -> None:
    from engine.assembly import parser_factory

    engine, backend = engine_and_backend
    tool_parser = parser_factory("tool_parser", parser)(tools=TOOLS)
    spec = tool_parser.call_constraint(forced, False)
    _, outs = run(engine, "What is the weather in Paris?",
                  backend.matcher(backend.compile(spec)), max_new_tokens=80)
    drain(engine)
    text = "".join(o.text for o in outs)
    assert outs[-1].finish_reason["type"] == "stop", (outs[-1], text)
    calls = tool_parser.parse(text).calls
    assert len(calls) == 1, text
    assert calls[0].name == (forced or calls[0].name)
    schema = next(t["function"]["parameters"] for t in TOOLS
                  if t["function"]["name"] == calls[0].name)
    jsonschema.validate(json.loads(calls[0].arguments), schema)


def test_without_a_grammar_plugin_an_unset_flag_means_no_constrained_decoding() -> None:
    from engine.errors import ConfigError

    registry = Registry(records=[r for r in Registry().records if r.family != "grammar"])
    assert Assembly(ServerConfig(), registry).grammar_backend(None, 10) is None
    with pytest.raises(ConfigError, match="--grammar-backend 'llguidance'"):
        Assembly(ServerConfig(grammar_backend="llguidance"), registry).grammar_backend(None, 10)


@pytest.mark.parametrize("thinking", [True, False], ids=["reasoning-open", "reasoning-optional"])
def test_a_forced_call_comes_after_the_reasoning_section_the_reasoning_parser_gives(
        thinking) -> None:
    from engine.assembly import parser_factory
    from engine.parsers.api import call_constraint, parse_message

    kw = {"enable_thinking": thinking}
    reasoning = parser_factory("reasoning_parser", "qwen3")(chat_template_kwargs=kw)
    assert reasoning.reasoning_section() == {"start": "<think>", "end": "</think>",
                                             "open": thinking}
    tools = parser_factory("tool_parser", "hermes")(tools=TOOLS)
    spec = call_constraint(tools, reasoning, "get_time", False)
    tok = kit.tiny_tokenizer()
    backend = Assembly(ServerConfig()).grammar_backend(tok, len(tok.hf))
    compiled = backend.compile(spec)

    def complete(text: str) -> bool:
        m = backend.matcher(compiled)
        return all(m.accept(t) for t in tok.hf.encode(text)) and m.accept(tok.eos_token_ids[0])

    call = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
    thought = "<think>" * (not thinking) + "the user wants the time </thin</think>\n\n"
    assert complete(thought + call)
    assert complete(call) is not thinking  # an open section must be closed first
    assert not complete(thought + call.replace("get_time", "get_weather"))
    message = parse_message(thought + call, reasoning_parser="qwen3", tool_parser="hermes",
                            tools=TOOLS, chat_template_kwargs=kw)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_time"]
    assert message["reasoning_content"].startswith("the user wants")
    # a reasoning parser that cannot say where its section ends: no constraint (checked after)

    class Opaque:
        def reasoning_section(self):
            return None

    assert call_constraint(tools, Opaque(), "", True) is None
