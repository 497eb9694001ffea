"""xgrammar: its GrammarCompiler (thread-safe, with its own cache) compiles; each sequence
gets a GrammarMatcher."""
from __future__ import annotations

import json
from typing import Any

import xgrammar as xgr

from engine.api import hookimpl
from engine.api.grammar import (GrammarBackend, GrammarMatcher, GrammarSpec, InvalidGrammar,
                                structural_tag_structures)


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
    kinds = ("json_schema", "json_object", "regex", "ebnf", "structural_tag")

    def __init__(self, tokenizer: Any, vocab_size: int, max_whitespace: int | None) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer.hf, vocab_size=vocab_size, stop_token_ids=list(tokenizer.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(info)
        self.max_whitespace = max_whitespace

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        if spec.kind in ("json_schema", "json_object"):
            schema = (_bounded_strings(spec.text) if spec.kind == "json_schema"
                      else '{"type": "object"}')
            return self.compiler.compile_json_schema(schema,
                                                     max_whitespace_cnt=self.max_whitespace)
        if spec.kind == "regex":
            return self.compiler.compile_regex(spec.text)
        if spec.kind == "structural_tag":
            return self.compiler.compile_structural_tag(_structural_tag(json.loads(spec.text)))
        return self.compiler.compile_grammar(spec.text)

    def compile(self, spec):
        self.check_kind(spec)
        try:
            return self._compile(spec)
        except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidGrammar(f"invalid {spec.kind}: {exc}") from None

    def matcher(self, compiled):
        return XGrammarMatcher(xgr.GrammarMatcher(compiled))


def _structural_tag(tag: Any) -> str:
    """xgrammar's own structural-tag format for a ``structural_tag`` spec: triggered tags, each
    its begin, a JSON value of its schema (any JSON without one), its end."""
    triggers, structures = structural_tag_structures(tag)
    tags = []
    for _, st in structures:
        schema = st.get("schema")
        content = {"type": "json_schema", "json_schema": schema if schema is not None else {}}
        tags.append({"type": "tag", "begin": st.get("begin", ""), "content": content,
                     "end": st.get("end", "")})
    return json.dumps({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": triggers, "tags": tags}})


@hookimpl
def engine_create_grammar_backend(tokenizer, vocab_size, options):
    return XGrammarBackend(tokenizer, vocab_size, options.constrained_json_max_whitespace_cnt)


def _bounded_strings(schema_text: str) -> str:
    """The schema with each length-bounded string (``maxLength``/``minLength``, no pattern,
    format, enum or const) given the equivalent pattern over characters that need no escape:
    xgrammar's length-bounded strings admit raw control characters, which JSON forbids. (Such
    a string then holds no quote, backslash or control character: a subset of its values.)"""
    schema = json.loads(schema_text)
    changed = False

    def walk(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {k: (v if k in ("enum", "const", "default", "examples") else walk(v))
               for k, v in node.items()}
        if out.get("type") == "string" and ("maxLength" in out or "minLength" in out) \
                and not {"pattern", "format", "enum", "const"} & out.keys():
            lo, hi = out.get("minLength", 0), out.get("maxLength")
            if isinstance(lo, int) and (hi is None or isinstance(hi, int)):
                out["pattern"] = '^[^"\\\\\\x00-\\x1f]{%d,%s}$' % (lo, "" if hi is None else hi)
                out.pop("minLength", None)  # in the pattern (xgrammar ignores them beside one)
                out.pop("maxLength", None)
                changed = True
        return out

    rewritten = walk(schema)
    return json.dumps(rewritten) if changed else schema_text
