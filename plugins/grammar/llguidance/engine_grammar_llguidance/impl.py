"""llguidance: a compiled grammar is a validated matcher; each sequence gets a deep copy."""
from __future__ import annotations

import copy
import json
from typing import Any

import llguidance
import torch

from engine.api import hookimpl
from engine.api.grammar import (GrammarBackend, GrammarMatcher, GrammarSpec, InvalidGrammar,
                                structural_tag_structures)


class LLGuidanceMatcher(GrammarMatcher):
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.m = matcher

    def fill_bitmask(self, bitmask, index):
        # what llguidance.torch.fill_next_token_bitmask does; that module is not imported, as
        # importing it runs torch.compile (seconds of start-up for torch._dynamo)
        row = bitmask[index]
        if bitmask.dtype != torch.int32 or not bitmask.is_cpu or not row.is_contiguous():
            raise ValueError("llguidance: the bitmask must be a contiguous int32 CPU tensor")
        self.m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def accept(self, token):
        return self.m.consume_token(token)

    def is_terminated(self):
        return self.m.is_stopped()

    def rollback(self, n):
        if not self.m.rollback(n):
            raise ValueError(f"llguidance cannot roll back {n} tokens: {self.m.get_error()}")


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, json_options: dict[str, Any]) -> None:
        eos = list(tokenizer.eos_token_ids)
        # the Rust tokenizer's JSON, without padding or truncation (what llguidance.hf does,
        # without importing transformers)
        if tokenizer.backend is None:
            raise ValueError("llguidance needs a fast (Rust) tokenizer; this one is a Python "
                             "tokenizer (--tokenizer-mode slow)")
        backend = copy.copy(tokenizer.backend)
        backend.no_padding()
        backend.no_truncation()
        text = backend.to_str()
        try:
            self.tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
        except TypeError:  # llguidance before list support: one end-of-sequence id
            self.tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size,
                                                    eos_token=eos[0] if eos else None)
        self.json_options = json_options
        self.special = dict(sorted(tokenizer.special_tokens().items(),
                                   key=lambda kv: -len(kv[0])))  # longest first

    def _grammar(self, spec: GrammarSpec) -> str:
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "ebnf":
            return llguidance.grammar_from("ebnf", spec.text)
        if spec.kind in ("tool_calls", "structural_tag"):
            tag = json.loads(spec.text)
            if not isinstance(tag, dict):
                raise ValueError(f"a {spec.kind} spec is a JSON object")
            lark = _Lark(self.special)
            build = lark.tool_calls if spec.kind == "tool_calls" else lark.structural_tag
            return llguidance.LLMatcher.grammar_from_lark(build(tag))
        schema = spec.text if spec.kind == "json_schema" else json.dumps({"type": "object"})
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=self.json_options)

    def compile(self, spec):
        self.check_kind(spec)
        try:
            grammar = self._grammar(spec)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidGrammar(f"invalid {spec.kind}: {exc}") from None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidGrammar(f"invalid {spec.kind}: {matcher.get_error()}")
        return matcher

    def matcher(self, compiled):
        return LLGuidanceMatcher(compiled.deep_copy())


#: the JSON of a tool call is written as ``json.dumps`` writes it (no other whitespace)
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: free text (structural tags, reasoning)
FREE_TEXT = "FREE_TEXT: /(.|\\n)*/\n"


class _Lark:
    """Builds the Lark text of a ``tool_calls`` or ``structural_tag`` spec. Literal text that
    holds one of the tokenizer's special tokens is written with that token's id (``<[id]>``):
    a special token is never the bytes of its text."""

    def __init__(self, special: dict[str, int]) -> None:
        self.special = special
        self.rules: list[str] = []
        self.count = 0

    def lit(self, text: str) -> str:
        """A sequence of terminals for ``text`` ("" when empty)."""
        if not text:
            return ""
        for tok, tid in self.special.items():
            i = text.find(tok)
            if i >= 0:
                parts = (self.lit(text[:i]), f"<[{tid}]>", self.lit(text[i + len(tok):]))
                return " ".join(p for p in parts if p)
        return json.dumps(text)

    def rule(self, body: str, name: str = "r", attrs: str = "") -> str:
        self.count += 1
        label = f"{name}_{self.count}"
        self.rules.append(f"{label}{attrs}: {body}")
        return label

    @staticmethod
    def json(schema: Any) -> str:
        if schema is None:
            schema = {}
        if not isinstance(schema, dict):
            raise ValueError(f"a schema must be a JSON object, not {schema!r}")
        return "%json " + json.dumps({**schema, "x-guidance": CALL_JSON})

    def kwargs(self, schema: Any) -> str:
        """Keyword arguments ``name=VALUE, ...`` of an object schema's properties (declared
        order; required ones always present; values as JSON)."""
        schema = schema or {}
        props = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        missing = required - set(props)
        if missing:
            raise ValueError(f"required properties without a schema: {sorted(missing)}")
        items = [(name, self.json(sub), name in required) for name, sub in props.items()]
        if not all(n.isidentifier() for n, _, _ in items):
            raise ValueError("keyword arguments need property names that are identifiers")
        # after[k]: the arguments from k on when one was written; before[k]: none yet
        after, before = ['""'], ['""']
        for name, value, req in reversed(items):
            head = f'{json.dumps(name + "=")} {value}'
            tail_after, tail_before = after[-1], before[-1]
            a = f'", " {head} {tail_after}' if req else f'(", " {head})? {tail_after}'
            b = f"{head} {tail_after}" if req else f"{head} {tail_after} | {tail_before}"
            after.append(self.rule(a, "after"))
            before.append(self.rule(b, "before"))
        return before[-1]

    def structure(self, st: dict[str, Any]) -> str:
        kind = st.get("arguments", "json")
        if kind == "json":
            value = self.json(st.get("schema"))
        elif kind == "kwargs":
            value = self.kwargs(st.get("schema"))
        else:
            raise ValueError(f"unknown arguments format {kind!r}")
        parts = [self.lit(st.get("begin", "")), value, self.lit(st.get("end", ""))]
        return " ".join(p for p in parts if p)

    def reasoning(self, section: dict[str, Any]) -> str:
        end = section.get("end")
        if not end:
            raise ValueError("a reasoning section needs its end marker")
        body = self.rule(f"FREE_TEXT {self.lit(end)}", "reasoning", "[lazy]")
        if not section.get("open"):
            body = f"({self.lit(section.get('start') or '')} {body})?"
        return f'{body} /[ \\t\\n]*/'

    def tool_calls(self, tag: dict[str, Any]) -> str:
        calls = [self.structure(st) for st in tag["structures"]]
        if not calls:
            raise ValueError("no tool to call")
        call = self.rule(" | ".join(calls), "call")
        sep = self.lit(tag.get("separator", "\n"))
        body = f"{call} ({sep} {call})*" if tag.get("parallel") else call
        parts = [self.reasoning(tag["reasoning"]) if tag.get("reasoning") else "",
                 self.lit(tag.get("prefix", "")), body, self.lit(tag.get("suffix", ""))]
        return self.grammar(" ".join(p for p in parts if p))

    def structural_tag(self, tag: dict[str, Any]) -> str:
        tags = []
        for trigger, st in structural_tag_structures(tag)[1]:
            head = self.rule(f"FREE_TEXT {self.lit(trigger)}", "text", "[lazy]")
            rest = self.structure({**st, "begin": st.get("begin", "")[len(trigger):]})
            tags.append(self.rule(f"{head} {rest}", "tag"))
        return self.grammar(f"({' | '.join(tags)})* FREE_TEXT")

    def grammar(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.rules, FREE_TEXT])


@hookimpl
def engine_create_grammar_backend(tokenizer, vocab_size, options):
    json_options: dict[str, Any] = {}
    if options.constrained_json_disable_any_whitespace:
        json_options["whitespace_flexible"] = False
    elif options.constrained_json_whitespace_pattern is not None:
        json_options["whitespace_pattern"] = options.constrained_json_whitespace_pattern
    return LLGuidanceBackend(tokenizer, vocab_size, json_options)
