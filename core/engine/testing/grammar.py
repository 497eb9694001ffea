"""Conformance kit for grammar backends (:mod:`engine.api.grammar`).

``check(name, build)`` returns failure messages (empty: pass); ``build(**hook_args)`` calls the
plugin's ``engine_create_grammar_backend``. It runs on a small byte-level BPE tokenizer made
here (no model needed), with a logits width beyond the tokenizer's length, and checks:

* the product is a :class:`~engine.api.grammar.GrammarBackend` whose ``kinds`` are known;
* a kind it does not list, and an invalid schema, regex or grammar of a kind it lists, raise
  :class:`~engine.api.grammar.InvalidGrammar` with a message;
* seeded random walks through each sample constraint of a supported kind (JSON schemas,
  regexes, a grammar, tool calls in JSON and as keyword arguments, structural tags) (a token
  drawn among
  the allowed ones each step, whitespace avoided while something else is allowed): every step
  allows some token and accepts the one drawn, the matcher is not terminated before the end,
  an end-of-sequence token ends every walk within a bounded number of steps, the matcher is
  terminated after it, and the text matches the constraint (JSON that validates against the
  schema, with ``jsonschema`` when it is installed; the regex; the grammar's language);
* a token outside the mask is refused by ``accept``; ``json_object`` (unbounded: no walks)
  accepts a given object token by token, then allows an end token, and refuses an array;
* ``rollback`` of up to :data:`ROLLBACK` tokens (when the backend has it) restores the
  allowed set of that earlier step.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Callable

from engine.api.grammar import KINDS, GrammarBackend, GrammarSpec, InvalidGrammar

#: strings the tiny tokenizer also has as single tokens (besides the 256 bytes)
WORDS = ("true", "false", "null", '"name"', '"age"', '"tags"', '":', '",', "hello", "alice",
         "12", " {", "},", "],")
WALKS = 6
MAX_STEPS = 400
ROLLBACK = 8  #: most tokens a walk's rollback check undoes

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "hello"]},
                 "minItems": 1, "maxItems": 3}},
     "required": ["name", "age", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {
        "v": {"anyOf": [{"type": "boolean"}, {"type": "null"}, {"enum": [1, 2]}]},
        "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                  "required": ["ok"], "additionalProperties": False}},
     "required": ["v", "inner"], "additionalProperties": False},
]
REGEXES = [r"(yes|no)-[0-9]{2}", r"[a-c]{1,4}@[a-z]{2}\.(com|org)"]
EBNF = 'root ::= greeting " " name\ngreeting ::= "hi" | "hello"\nname ::= "bob" | "alice"\n'
EBNF_LANGUAGE = {f"{g} {n}" for g in ("hi", "hello") for n in ("bob", "alice")}
TOOL_CALLS = {"parallel": True, "structures": [
    {"begin": "<call>\n", "end": "\n</call>", "schema": {
        "type": "object", "properties": {"name": {"const": "alice"}, "age": {"enum": [12, 7]}},
        "required": ["name", "age"], "additionalProperties": False}},
    {"begin": "<call>\n", "end": "", "schema": {
        "type": "object", "properties": {"name": {"const": "bob"}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"], "additionalProperties": False}}]}
#: calls in a Python-list format: keyword arguments, a prefix, separator and suffix
KWARGS_CALLS = {"parallel": True, "prefix": "[", "separator": ", ", "suffix": "]", "structures": [
    {"begin": "alice(", "end": ")", "arguments": "kwargs", "schema": {
        "type": "object", "properties": {"age": {"enum": [12, 7]}, "ok": {"type": "boolean"},
                                         "name": {"enum": ["bob", "alice"]}},
        "required": ["name"], "additionalProperties": False}}]}
STRUCTURAL_TAG = {"triggers": ["<f"], "structures": [
    {"begin": "<f=a>", "end": "</f>", "schema": {
        "type": "object", "properties": {"age": {"enum": [12, 7]}}, "required": ["age"],
        "additionalProperties": False}},
    {"begin": "<f=b>", "end": "</f>", "schema": {"enum": [True, None]}}]}
INVALID = {
    "json_schema": '{"type": "object", "properties": ',
    "regex": "a(b",
    "ebnf": 'root ::= "a" (',
    "tool_calls": '{"structures": [{"begin": "<call>", "schema": {"type": 5}, "end": ""}]}',
    "structural_tag": '{"structures": [{"begin": "<x>", "schema": {}, "end": ""}], '
                      '"triggers": ["<f"]}',
}


def tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer (256 bytes, :data:`WORDS`, ``</s>``) as the hook's
    ``tokenizer`` argument is: an :class:`engine.models.tokenizer.Tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    byte_char = dict(zip(range(256), _bytes_to_unicode()))
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        symbols = [byte_char[b] for b in word.encode()]
        left = symbols[0]
        for right in symbols[1:]:
            if left + right not in vocab:
                merges.append((left, right))
                vocab[left + right] = len(vocab)
            left += right
    model = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    model.decoder = decoders.ByteLevel()
    from engine.models.tokenizer import Tokenizer as EngineTokenizer

    hf = PreTrainedTokenizerFast(tokenizer_object=model, eos_token="</s>")
    return EngineTokenizer.from_hf(hf)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def samples() -> list[tuple[GrammarSpec, Callable[[str], bool]]]:
    """Each sample constraint with the test its complete texts must pass."""
    out: list[tuple[GrammarSpec, Callable[[str], bool]]] = []
    for schema in SCHEMAS:
        out.append((GrammarSpec("json_schema", json.dumps(schema)),
                    lambda text, schema=schema: _valid_json(text, schema)))
    for pattern in REGEXES:
        out.append((GrammarSpec("regex", pattern),
                    lambda text, pattern=pattern: re.fullmatch(pattern, text) is not None))
    out.append((GrammarSpec("ebnf", EBNF), lambda text: text in EBNF_LANGUAGE))
    out.append((GrammarSpec("tool_calls", json.dumps(TOOL_CALLS)), _valid_tool_calls))
    out.append((GrammarSpec("tool_calls", json.dumps(KWARGS_CALLS)), _valid_kwargs_calls))
    out.append((GrammarSpec("structural_tag", json.dumps(STRUCTURAL_TAG)), _valid_tagged))
    return out


def _valid_kwargs_calls(text: str) -> bool:
    """Whether ``text`` is a Python list of :data:`KWARGS_CALLS` calls."""
    from engine.parsers.json_tools import parse_pythonic_calls

    st = KWARGS_CALLS["structures"][0]
    calls = parse_pythonic_calls(text)
    return calls is not None and text.startswith("[") and all(
        name + "(" == st["begin"] and _schema_ok(args, st["schema"]) for name, args in calls)


def _valid_tagged(text: str) -> bool:
    """Whether every trigger in ``text`` starts a :data:`STRUCTURAL_TAG` structure."""
    decoder, pos = json.JSONDecoder(), 0
    while True:
        found = [i for t in STRUCTURAL_TAG["triggers"] if (i := text.find(t, pos)) >= 0]
        if not found:
            return True
        pos = min(found)
        for st in STRUCTURAL_TAG["structures"]:
            if not text.startswith(st["begin"], pos):
                continue
            start = pos + len(st["begin"])
            start += len(text[start:]) - len(text[start:].lstrip())
            try:
                value, end = decoder.raw_decode(text, start)
            except ValueError:
                continue
            end += len(text[end:]) - len(text[end:].lstrip(" \t\r\n"))
            if _schema_ok(value, st["schema"]) and text.startswith(st["end"], end):
                pos = end + len(st["end"])
                break
        else:
            return False


def _valid_tool_calls(text: str) -> bool:
    """Whether ``text`` is one or more :data:`TOOL_CALLS` structures separated by newlines."""
    decoder, pos, first = json.JSONDecoder(), 0, True
    while pos < len(text) or first:
        if not first:
            if not text.startswith("\n", pos):
                return False
            pos += 1
        first = False
        for st in TOOL_CALLS["structures"]:
            if not text.startswith(st["begin"], pos):
                continue
            start = pos + len(st["begin"])
            start += len(text[start:]) - len(text[start:].lstrip())
            try:
                value, end = decoder.raw_decode(text, start)
            except ValueError:
                continue
            end += len(text[end:]) - len(text[end:].lstrip(" \t\r")) if st["end"] else 0
            if _schema_ok(value, st["schema"]) and text.startswith(st["end"], end):
                pos = end + len(st["end"])
                break
        else:
            return False
    return True


def _schema_ok(value: Any, schema: dict[str, Any]) -> bool:
    try:
        import jsonschema
    except ImportError:
        return isinstance(value, dict)
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _valid_json(text: str, schema: dict[str, Any]) -> bool:
    value = _loads(text)
    return value is not None and _schema_ok(value, schema)


def check(name: str, build: Callable[..., Any]) -> list[str]:
    from engine.config import ServerConfig

    tok = tiny_tokenizer()
    vocab = len(tok.hf) + 37  # logits wider than the tokenizer, as many models have
    backend = build(tokenizer=tok, vocab_size=vocab, config=ServerConfig())
    if not isinstance(backend, GrammarBackend):
        return [f"the hook returned {type(backend).__name__}, not a GrammarBackend"]
    unknown = set(backend.kinds) - set(KINDS)
    if unknown:
        return [f"kinds lists unknown kinds {sorted(unknown)}"]
    failures: list[str] = []
    for kind in KINDS:
        bad = INVALID.get(kind) if kind in backend.kinds else "{}"
        if bad is None:
            continue
        try:
            backend.compile(GrammarSpec(kind, bad))
            failures.append(f"{kind} {bad!r} compiled; expected InvalidGrammar")
        except InvalidGrammar as exc:
            if not str(exc):
                failures.append(f"InvalidGrammar without a message for {kind} {bad!r}")
    rng = random.Random(0)
    for spec, valid in samples():
        if spec.kind in backend.kinds:
            failures += _walks(backend, spec, valid, tok, vocab, rng)
    if "json_object" in backend.kinds:
        failures += _json_object(backend, tok, vocab)
    return failures


def _json_object(backend: GrammarBackend, tok: Any, vocab: int) -> list[str]:
    """Any JSON object (unbounded, so no walks): a given one is accepted token by token and
    then allows an end token; a JSON array is refused."""
    compiled = backend.compile(GrammarSpec("json_object"))
    m = backend.matcher(compiled)
    for t in tok.hf.encode('{"name": "alice", "tags": [true, null, 12], "x": {}}'):
        if not m.accept(t):
            return [f"json_object: refused {tok.hf.decode([t])!r} of a JSON object"]
    if not set(m.allowed_tokens(vocab)) & set(tok.eos_token_ids):
        return ["json_object: no end token allowed after a complete object"]
    if backend.matcher(compiled).accept(tok.hf.encode("[")[0]):
        return ["json_object: accepted '[' to start"]
    return []


def _walks(backend: GrammarBackend, spec: GrammarSpec, valid: Callable[[str], bool], tok: Any,
           vocab: int, rng: random.Random) -> list[str]:
    label = f"{spec.kind} {spec.text[:60]!r}"
    compiled = backend.compile(spec)
    eos = set(tok.eos_token_ids)
    blank = {t for t in range(len(tok.hf)) if not tok.hf.decode([t]).strip()}
    first = backend.matcher(compiled).allowed_tokens(vocab)
    outside = next((t for t in range(vocab) if t not in first), None)
    if outside is None:
        return [f"{label}: allows every token at the start"]
    if backend.matcher(compiled).accept(outside):
        return [f"{label}: accepted token {outside}, which the mask forbids"]
    for _ in range(WALKS):
        m = backend.matcher(compiled)
        if m.is_terminated():
            return [f"{label}: terminated before any token"]
        tokens: list[int] = []
        for _ in range(MAX_STEPS):
            allowed = m.allowed_tokens(vocab)
            if not allowed:
                return [f"{label}: no token allowed after {tok.hf.decode(tokens)!r}"]
            ends = [t for t in allowed if t in eos]
            if ends and rng.random() < 0.5:
                choice = ends[0]
            else:
                pick = [t for t in allowed if t not in blank and t not in eos] or allowed
                choice = rng.choice(pick)
            if not m.accept(choice):
                return [f"{label}: refused token {choice}, which its mask allowed"]
            if choice in eos:
                break
            tokens.append(choice)
            if m.is_terminated() and not any(t in eos for t in m.allowed_tokens(vocab)):
                return [f"{label}: terminated but does not allow an end token"]
        else:
            return [f"{label}: no end after {MAX_STEPS} tokens: {tok.hf.decode(tokens)!r}"]
        if not m.is_terminated():
            return [f"{label}: not terminated after an end token"]
        text = tok.hf.decode(tokens)
        if not valid(text):
            return [f"{label}: produced {text!r}, which does not match"]
        if len(tokens) >= 2:
            failure = _rollback(backend, compiled, tokens, vocab)
            if failure:
                return [f"{label}: {failure}"]
    return []


def _rollback(backend: GrammarBackend, compiled: Any, tokens: list[int], vocab: int) -> str:
    """Roll back the last few tokens of a walk: the allowed set is that of before them."""
    k = min(len(tokens) - 1, ROLLBACK)
    m = backend.matcher(compiled)
    for t in tokens[:-k]:
        m.accept(t)
    expected = m.allowed_tokens(vocab)
    for t in tokens[-k:]:
        m.accept(t)
    try:
        m.rollback(k)
    except NotImplementedError:
        return ""
    if m.allowed_tokens(vocab) != expected:
        return f"rollback({k}) did not restore the allowed tokens"
    return ""
