"""xgrammar: its GrammarCompiler (thread-safe, with its own cache) compiles; each sequence
gets a GrammarMatcher."""
from __future__ import annotations

from typing import Any

import xgrammar as xgr

from engine.api import hookimpl
from engine.api.grammar import GrammarBackend, GrammarMatcher, GrammarSpec, InvalidGrammar


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.m = matcher

    def fill_bitmask(self, bitmask, index):
        self.m.fill_next_token_bitmask(bitmask, index)

    def accept(self, token):
        return self.m.accept_token(token)

    def is_terminated(self):
        return self.m.is_terminated()

    def rollback(self, n):
        self.m.rollback(n)


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"
    kinds = ("json_schema", "json_object", "regex", "ebnf")

    def __init__(self, tokenizer: Any, vocab_size: int, max_whitespace: int | None) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer.hf, vocab_size=vocab_size, stop_token_ids=list(tokenizer.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(info)
        self.max_whitespace = max_whitespace

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        if spec.kind in ("json_schema", "json_object"):
            schema = spec.text if spec.kind == "json_schema" else '{"type": "object"}'
            return self.compiler.compile_json_schema(schema,
                                                     max_whitespace_cnt=self.max_whitespace)
        if spec.kind == "regex":
            return self.compiler.compile_regex(spec.text)
        return self.compiler.compile_grammar(spec.text)

    def compile(self, spec):
        self.check_kind(spec)
        try:
            return self._compile(spec)
        except (RuntimeError, ValueError) as exc:
            raise InvalidGrammar(f"invalid {spec.kind}: {exc}") from None

    def matcher(self, compiled):
        return XGrammarMatcher(xgr.GrammarMatcher(compiled))


@hookimpl
def engine_create_grammar_backend(tokenizer, vocab_size, options):
    return XGrammarBackend(tokenizer, vocab_size, options.constrained_json_max_whitespace_cnt)
