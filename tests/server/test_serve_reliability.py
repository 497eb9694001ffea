"""Through a real server: one request never disturbs another. Penalised and greedy requests
batch together with unchanged greedy outputs; degenerate sampling values are refused (400
naming the field) or defined (a tiny temperature is greedy); a rid in flight is unique and an
abandoned request ends only itself; random bodies on the three generation routes never get a
5xx, never hang, and leave the server serving the same greedy output."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.runtime.sampling import SamplingParams
from engine.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

pytestmark = pytest.mark.slow

CHAT, COMPL, GEN = "/v1/chat/completions", "/v1/completions", "/generate"
GREEDY_PROMPTS = ["The sea is", "A red fox jumped", "Winter mornings are"]
MAX_TOKENS = 8


def post_raw(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    """POST ``body`` as JSON that may hold ``Infinity``/``NaN`` (Python's JSON extension)."""
    return client.post(path, content=json.dumps(body).encode(),
                       headers={"content-type": "application/json"})


def generate(client: httpx.Client, text: str, **sp: Any) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS,
                                              **sp}}
    r = post_raw(client, GEN, body)
    assert r.status_code == 200, r.text
    return r.json()


def test_penalties_and_min_tokens_batch_with_greedy_requests(main_server) -> None:
    special = [{"repetition_penalty": 1.1}, {"frequency_penalty": 0.5},
               {"presence_penalty": 0.5}, {"min_tokens": 6, "ignore_eos": False}]
    with main_server.client() as c:
        c.post("/flush_cache")
        alone = [generate(c, p)["output_ids"] for p in GREEDY_PROMPTS]
        c.post("/flush_cache")
        jobs = [(p, {}) for p in GREEDY_PROMPTS] + [("Tell me about the sea:", sp)
                                                      for sp in special]
        with ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda job: generate(c, job[0], **job[1]), jobs))
    assert [r["output_ids"] for r in results[:3]] == alone
    for r in results[3:]:
        assert r["meta_info"]["finish_reason"]["type"] in ("length", "stop"), r
    assert len(results[-1]["output_ids"]) >= 6


REFUSED = [
    # (path, sampling fields, the field named)
    (COMPL, {"temperature": math.inf, "min_tokens": 2}, "temperature"),
    (COMPL, {"repetition_penalty": 1e-300}, "repetition_penalty"),
    (COMPL, {"repetition_penalty": math.inf}, "repetition_penalty"),
    (COMPL, {"seed": 10**30, "temperature": 1.0}, "seed"),
    (COMPL, {"seed": 2**63}, "seed"),
    (COMPL, {"top_p": math.nan}, "top_p"),
    (CHAT, {"presence_penalty": -math.inf}, "presence_penalty"),
    (CHAT, {"frequency_penalty": math.nan}, "frequency_penalty"),
    (GEN, {"temperature": math.inf, "min_new_tokens": 2}, "temperature"),
    (GEN, {"repetition_penalty": 1e-300}, "repetition_penalty"),
    (GEN, {"seed": 10**30, "temperature": 1.0}, "seed"),
    (GEN, {"min_p": 10**400}, "min_p"),
]


def body_for(path: str, fields: dict[str, Any]) -> dict[str, Any]:
    if path == GEN:
        return {"text": "Hello", "sampling_params": {"max_new_tokens": 4, **fields}}
    if path == CHAT:
        return {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, **fields}
    return {"prompt": "Hello", "max_tokens": 4, **fields}


@pytest.mark.parametrize("case", REFUSED, ids=[f"{c[0]}-{c[2]}-{i}"
                                               for i, c in enumerate(REFUSED)])
def test_non_finite_and_out_of_range_values_are_400_naming_the_field(main_server,
                                                                     case) -> None:
    path, fields, param = case
    with main_server.client() as c:
        r = post_raw(c, path, body_for(path, fields))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tiny_temperatures_are_greedy_and_seeds_span_64_bits(main_server) -> None:
    prompt = GREEDY_PROMPTS[0]
    with main_server.client() as c:
        greedy = generate(c, prompt)["output_ids"]
        for t in (1e-300, 1e-40, 5e-6):
            assert generate(c, prompt, temperature=t, seed=3)["output_ids"] == greedy
        for seed in (-2**63, 2**63 - 1):
            a = generate(c, prompt, temperature=1.0, seed=seed, n=2)
            b = generate(c, prompt, temperature=1.0, seed=seed, n=2)
            assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b]


def _running(client: httpx.Client) -> int:
    return client.get("/get_server_info").json()["scheduler"]["num_running"]


def test_a_rid_in_flight_is_unique_and_leaving_ends_only_ones_own_request(main_server) -> None:
    """A streams as "job-1". A second request with that rid is refused; a request with rid
    "job" and n=2 (its sequences would be called job-0 and job-1) that the client abandons
    ends itself only; A then reads to its last token, and "job-1" is free again."""
    body = {"text": "Write a long story about a lighthouse:", "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 160, "ignore_eos": True}}
    with main_server.client() as c:
        with c.stream("POST", GEN, json={**body, "rid": "job-1"}) as a:
            assert a.status_code == 200
            events = a.iter_lines()
            assert next(e for e in events if e.startswith("data: "))
            dup = c.post(GEN, json={"text": "Hi", "rid": "job-1",
                                    "sampling_params": {"max_new_tokens": 2}})
            assert dup.status_code == 400 and dup.json()["error"]["param"] == "rid"
            with c.stream("POST", GEN, json={**body, "rid": "job", "sampling_params": {
                    **body["sampling_params"], "n": 2}}) as b:
                assert b.status_code == 200
                assert next(e for e in b.iter_lines() if e.startswith("data: "))
            deadline = time.monotonic() + 60  # hang guard: B's abort lands within a second
            while _running(c) > 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            last = [json.loads(e[6:]) for e in events
                    if e.startswith("data: ") and e != "data: [DONE]"][-1]
        assert last["meta_info"]["finish_reason"] == {"type": "length"}
        assert len(last["output_ids"]) == 160 and last["meta_info"]["id"] == "job-1"
        again = c.post(GEN, json={"text": "Hi", "rid": "job-1",
                                  "sampling_params": {"max_new_tokens": 2}})
        assert again.status_code == 200, again.text


# ---------------------------------------------------------------------- fuzzing

def mostly(usual: st.SearchStrategy, rare: st.SearchStrategy) -> st.SearchStrategy:
    """``usual`` three times in four, else ``rare``."""
    return st.integers(0, 3).flatmap(lambda k: rare if k == 3 else usual)


SMALL = st.integers(0, 3)
#: values a length field may take: small, or refused (never None: that means "up to the
#: context length", which would make an example slow)
LENGTHS = st.one_of(SMALL, st.sampled_from([-1, 10**30, -2**63, 2.5, "4", [1], {}, True]))
EDGE_INTS = st.sampled_from([-1, 0, 1, 2, 5, 21, 129, 2**31, 2**63, -2**63 - 1, 10**30])
EDGE_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                        st.sampled_from([0.0, -0.0, 1e-300, 1e-40, 5e-324, 1e300, 0.5, 1.5]))
#: text: mostly ordinary (not empty), else empty or with lone surrogates (sent as JSON escapes
#: such as "\ud800"), which every field refuses with a 400 naming it
TEXT = mostly(st.text(min_size=1, max_size=24), st.lists(st.sampled_from(
    ["\ud800", "\udc00", "\udfff", "x", "\x00", "\u00e9", "\U0001f600"]),
    max_size=4).map("".join))
MODEL = mostly(st.none(), st.one_of(st.just("SmolLM2-135M-Instruct.Q4_1"), TEXT))
SCALARS = st.one_of(st.none(), st.booleans(), EDGE_INTS, EDGE_FLOATS, TEXT)
WILD = st.recursive(SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(TEXT, kids, max_size=3)), max_leaves=6)


def typed(usual: st.SearchStrategy) -> st.SearchStrategy:
    """A nested field: ``usual`` values three times in four, else a wild one (any type)."""
    return mostly(usual, WILD)


TOKEN_IDS = st.lists(st.one_of(st.integers(0, 49151), EDGE_INTS), min_size=1, max_size=6)


def own_values(annotation: Any) -> st.SearchStrategy:
    """Values of a field's declared type: mostly ordinary ones, some edge values, and a
    quarter wild."""
    kind = str(annotation)
    if "bool" in kind:
        usual, edge = st.booleans(), st.sampled_from([0, 1, "true"])
    elif "float" in kind:
        usual, edge = st.floats(0.05, 1), EDGE_FLOATS
    elif "dict" in kind:
        usual = edge = st.dictionaries(TEXT, WILD, max_size=3)
        if "list[dict" in kind:
            usual = st.lists(usual, max_size=2)
    elif "list[int]" in kind:
        usual, edge = st.lists(SMALL, max_size=3), st.lists(EDGE_INTS, max_size=3)
    elif "list[str]" in kind:
        usual = edge = st.one_of(TEXT, st.lists(TEXT, max_size=3))
    elif "str" in kind:
        usual = edge = TEXT
    elif "int" in kind:
        usual, edge = SMALL, EDGE_INTS
    else:
        usual = edge = WILD
    return mostly(mostly(usual, edge), WILD)


def bodies(fields: dict[str, Any], special: dict[str, st.SearchStrategy],
           always: set[str]) -> st.SearchStrategy:
    """JSON bodies over the real ``fields`` (name -> declared type): a random few with values
    of their type or wild ones, and the fields of ``special`` drawn from their own
    strategies (those in ``always`` in every body, the others now and then)."""
    drawn = st.lists(st.sampled_from([n for n in fields if n not in special]), max_size=4,
                     unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: own_values(fields[n]) for n in names}))
    return st.tuples(
        drawn,
        st.fixed_dictionaries({}, optional={k: v for k, v in special.items()
                                            if k not in always}),
        st.fixed_dictionaries({k: special[k] for k in always}),
    ).map(lambda parts: {**parts[0], **parts[1], **parts[2]})


def pydantic_fields(model: Any) -> dict[str, Any]:
    return {name: f.annotation for name, f in model.model_fields.items()}


SAMPLING_FIELDS = {**{f.name: f.type for f in dataclasses.fields(SamplingParams)},
                   "max_tokens": int, "min_tokens": int, "sampling_seed": int}
SAMPLING = bodies(SAMPLING_FIELDS, {"max_new_tokens": LENGTHS, "max_tokens": LENGTHS},
                  {"max_new_tokens"})

TEXTS = st.one_of(TEXT, st.lists(TEXT, max_size=3))
TOKEN_ID_LISTS = st.one_of(TOKEN_IDS, st.lists(TOKEN_IDS, max_size=2))
GENERATE_BODIES = st.tuples(bodies(pydantic_fields(GenerateRequest), {
    "sampling_params": mostly(SAMPLING, st.lists(SAMPLING, max_size=2)),
    "rid": TEXT,
    "text": st.nothing(), "input_ids": st.nothing(),  # drawn together, below
}, {"sampling_params"}), mostly(  # mostly exactly one of text and input_ids
    st.one_of(st.fixed_dictionaries({"text": TEXTS}),
              st.fixed_dictionaries({"input_ids": TOKEN_ID_LISTS})),
    st.fixed_dictionaries({}, optional={"text": TEXTS, "input_ids": TOKEN_ID_LISTS}),
)).map(lambda parts: {**parts[0], **parts[1]})

STREAM_OPTIONS = typed(st.fixed_dictionaries({}, optional={
    "include_usage": typed(st.booleans()), "continuous_usage_stats": typed(st.booleans())}))
FUNCTION_CALL = st.fixed_dictionaries({"function": typed(st.fixed_dictionaries(
    {"name": typed(TEXT), "arguments": typed(TEXT)}))})
MESSAGE = st.fixed_dictionaries({
    "role": typed(st.sampled_from(["system", "user", "assistant", "tool"])),
    "content": typed(st.one_of(TEXT, st.none(), st.lists(typed(st.fixed_dictionaries({
        "type": typed(st.sampled_from(["text", "image_url"])), "text": typed(TEXT)})),
        max_size=2))),
}, optional={"name": typed(TEXT), "tool_call_id": typed(TEXT),
             "tool_calls": typed(st.lists(typed(FUNCTION_CALL), max_size=2))})
TOOL = st.fixed_dictionaries({"type": typed(st.just("function")), "function": typed(
    st.fixed_dictionaries({"name": typed(TEXT)}, optional={
        "description": typed(TEXT),
        "parameters": typed(st.dictionaries(TEXT, WILD, max_size=3))}))})
#: keys of ``chat_template_kwargs`` that the server's own code reads or passes on
TEMPLATE_KWARGS = st.fixed_dictionaries({}, optional={
    k: typed(st.booleans()) for k in ("enable_thinking", "tokenize", "add_generation_prompt",
                                      "continue_final_message")})

CHAT_BODIES = bodies(pydantic_fields(ChatCompletionRequest), {
    "messages": typed(st.lists(MESSAGE, min_size=1, max_size=3)),
    "model": MODEL,
    "tools": typed(st.lists(typed(TOOL), max_size=2)),
    "tool_choice": mostly(st.sampled_from(["none", "auto", "required"]), typed(
        st.fixed_dictionaries({"type": typed(st.just("function")), "function": typed(
            st.fixed_dictionaries({"name": typed(TEXT)}))}))),
    "chat_template_kwargs": typed(TEMPLATE_KWARGS),
    "stream_options": STREAM_OPTIONS,
    "max_tokens": LENGTHS,
    "max_completion_tokens": LENGTHS,
}, {"messages", "max_tokens", "max_completion_tokens"})

COMPLETION_BODIES = bodies(pydantic_fields(CompletionRequest), {
    "prompt": st.one_of(TEXTS, TOKEN_IDS, st.lists(TOKEN_IDS, max_size=2), WILD),
    "model": MODEL,
    "suffix": st.one_of(st.none(), TEXT),
    "stream_options": STREAM_OPTIONS,
    "max_tokens": LENGTHS,
}, {"prompt", "max_tokens"})


def check_answer(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    """No 5xx, an error object with every 4xx, and a stream that ends with [DONE]."""
    raw = json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as escapes
    headers = {"content-type": "application/json"}
    with client.stream("POST", path, content=raw, headers=headers) as r:
        text = "".join(r.iter_text())  # a broken stream raises here
    assert r.status_code < 500, f"{path} {raw!r} -> {r.status_code} {text}"
    if r.status_code >= 400:
        assert "message" in json.loads(text)["error"], text
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert text.rstrip().endswith("data: [DONE]"), text
        assert '"internal_error"' not in text, text
    else:
        json.loads(text)


FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def fuzz_client(main_server):
    with main_server.client(timeout=60) as c:  # the timeout is the hang guard
        before = generate(c, GREEDY_PROMPTS[1])["output_ids"]
        yield c
        assert c.get("/health_generate").status_code == 200
        assert generate(c, GREEDY_PROMPTS[1])["output_ids"] == before


@FUZZ
@given(body=GENERATE_BODIES)
def test_fuzz_generate(fuzz_client, body) -> None:
    check_answer(fuzz_client, GEN, body)


@FUZZ
@given(body=COMPLETION_BODIES)
def test_fuzz_completions(fuzz_client, body) -> None:
    check_answer(fuzz_client, COMPL, body)


@FUZZ
@given(body=CHAT_BODIES)
def test_fuzz_chat_completions(fuzz_client, body) -> None:
    check_answer(fuzz_client, CHAT, body)
