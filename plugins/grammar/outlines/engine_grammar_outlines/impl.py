"""outlines-core: a spec becomes a regex, the regex an Index over the vocabulary (the compiled
grammar), and each sequence walks it with a Guide."""
from __future__ import annotations

import json
import re
from typing import Any

import outlines_core

from engine.api import PluginError, hookimpl
from engine.api.grammar import GrammarBackend, GrammarMatcher, GrammarSpec, InvalidGrammar
from engine_grammar_outlines.ranges import bounded_regex

MAX_ROLLBACK = 32  #: tokens a matcher can undo


class OutlinesMatcher(GrammarMatcher):
    def __init__(self, index: outlines_core.Index, eos: int) -> None:
        self.guide = outlines_core.Guide(index, max_rollback=MAX_ROLLBACK)
        self.eos = eos
        self.ended = False

    def fill_bitmask(self, bitmask, index):
        row = bitmask[index]
        if self.ended:
            row.zero_()
            return
        self.guide.write_mask_into(row.data_ptr(), row.numel(), row.element_size())

    def accept(self, token):
        if self.ended:
            return False
        if token == self.eos:
            self.ended = self.guide.is_finished()
            return self.ended
        if not self.guide.accepts_tokens([token]):
            return False
        self.guide.advance(token, return_tokens=False)
        return True

    def is_terminated(self):
        return self.ended or (self.guide.is_finished() and self.guide.get_tokens() == [self.eos])

    def rollback(self, n):
        self.guide.rollback_state(n)


class OutlinesBackend(GrammarBackend):
    name = "outlines"
    kinds = ("json_schema", "json_object", "regex")

    def __init__(self, tokenizer: Any, whitespace: str | None) -> None:
        self.eos = tokenizer.eos_token_ids[0]
        self.vocabulary = outlines_core.Vocabulary(self.eos, _token_bytes(tokenizer.hf, self.eos))
        self.whitespace = whitespace

    def _regex(self, spec: GrammarSpec) -> str:
        if spec.kind == "regex":
            re.compile(spec.text)
            return spec.text
        if spec.kind == "json_object":
            return outlines_core.json_schema.build_regex_from_schema('{"type": "object"}',
                                                                     self.whitespace)
        return bounded_regex(spec.text, self.whitespace)

    def compile(self, spec):
        self.check_kind(spec)
        try:
            return outlines_core.Index(self._regex(spec), self.vocabulary)
        except (ValueError, TypeError, re.error) as exc:  # json.JSONDecodeError is a ValueError
            raise InvalidGrammar(f"invalid {spec.kind}: {exc}") from None

    def matcher(self, compiled):
        return OutlinesMatcher(compiled, self.eos)


def _token_bytes(hf: Any, eos: int) -> dict[bytes, list[int]]:
    """Each ordinary token's bytes -> its ids (special tokens left out: never allowed)."""
    decoder = json.loads(hf.backend_tokenizer.to_str()).get("decoder") or {}
    kinds = {d.get("type") for d in decoder.get("decoders", [decoder])}
    special = set(hf.all_special_ids) | {eos}
    if "ByteLevel" in kinds:
        table = {ch: b for b, ch in enumerate(_bytes_to_unicode())}
        to_bytes = lambda tok: bytes(table[c] for c in tok)  # noqa: E731
    elif "ByteFallback" in kinds:
        def to_bytes(tok: str) -> bytes:
            if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", tok):
                return bytes([int(tok[3:5], 16)])
            return tok.replace("\u2581", " ").encode()
    else:
        raise PluginError(f"outlines: tokenizers decoded by {sorted(kinds)} are not supported "
                          "(byte-level or SentencePiece byte fallback only)")
    out: dict[bytes, list[int]] = {}
    for tok, tid in hf.get_vocab().items():
        if tid not in special:
            out.setdefault(to_bytes(tok), []).append(tid)
    return out


def _bytes_to_unicode() -> list[str]:
    keep = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    chars, extra = [], 0
    for b in range(256):
        chars.append(chr(b) if b in keep else chr(256 + extra))
        extra += b not in keep
    return chars


@hookimpl
def engine_create_grammar_backend(tokenizer, options):
    return OutlinesBackend(tokenizer, options.outlines_json_whitespace_pattern)
