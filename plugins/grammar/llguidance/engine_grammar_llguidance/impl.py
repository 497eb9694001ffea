"""llguidance: a compiled grammar is a validated matcher; each sequence gets a deep copy."""
from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch

from engine.api import hookimpl
from engine.api.grammar import GrammarBackend, GrammarMatcher, GrammarSpec, InvalidGrammar


class LLGuidanceMatcher(GrammarMatcher):
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.m = matcher

    def fill_bitmask(self, bitmask, index):
        llguidance.torch.fill_next_token_bitmask(self.m, bitmask, index)

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
        self.tokenizer = llguidance.hf.from_tokenizer(
            tokenizer.hf, n_vocab=vocab_size, eos_token=list(tokenizer.eos_token_ids))
        self.json_options = json_options

    def _grammar(self, spec: GrammarSpec) -> str:
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "ebnf":
            return llguidance.grammar_from("ebnf", spec.text)
        if spec.kind == "tool_calls":
            return llguidance.LLMatcher.grammar_from_lark(_tool_calls_lark(json.loads(spec.text)))
        schema = spec.text if spec.kind == "json_schema" else json.dumps({"type": "object"})
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=self.json_options)

    def compile(self, spec):
        self.check_kind(spec)
        try:
            grammar = self._grammar(spec)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidGrammar(f"invalid {spec.kind}: {exc}") from None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidGrammar(f"invalid {spec.kind}: {matcher.get_error()}")
        return matcher

    def matcher(self, compiled):
        return LLGuidanceMatcher(compiled.deep_copy())


#: the JSON of a tool call is written as ``json.dumps`` writes it (no other whitespace)
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _tool_calls_lark(tag: dict[str, Any]) -> str:
    """Lark for a ``tool_calls`` spec: each structure is its begin, an inline ``%json`` schema,
    its end; one of them, or with ``parallel`` one or more separated by newlines."""
    calls = []
    for s in tag["structures"]:
        schema = json.dumps({**s["schema"], "x-guidance": CALL_JSON})
        calls.append(" ".join(filter(None, (json.dumps(s["begin"]), "%json", schema,
                                            s["end"] and json.dumps(s["end"])))))
    if not calls:
        raise ValueError("no tool to call")
    start = 'start: call ("\\n" call)*' if tag.get("parallel") else "start: call"
    return f"{start}\ncall: " + "\n    | ".join(calls) + "\n"


@hookimpl
def engine_create_grammar_backend(tokenizer, vocab_size, options):
    json_options: dict[str, Any] = {}
    if options.constrained_json_disable_any_whitespace:
        json_options["whitespace_flexible"] = False
    elif options.constrained_json_whitespace_pattern is not None:
        json_options["whitespace_pattern"] = options.constrained_json_whitespace_pattern
    return LLGuidanceBackend(tokenizer, vocab_size, json_options)
