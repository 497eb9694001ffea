"""Tokenizer from GGUF metadata, chat template, and the incremental detokenizer."""

from __future__ import annotations

import pytest

from engine.models.tokenizer import IncrementalDetokenizer

from _default_model import default_runner

TEXTS = ["Hello 👋 world! 你好，世界。 Ünïcödé 🎉🎉 done",
         "emoji family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, CJK 漢字かなカナ한국어",
         "  leading spaces\n\ttabs and <|im_end|> special"]


@pytest.fixture(scope="module")
def tok():
    return default_runner().tokenizer


def test_tokenizer_from_gguf(tok):
    ids = tok.encode("The capital of France is")
    assert tok.decode(ids) == "The capital of France is"
    assert tok.vocab_size == 49152 and tok.eos_token_ids == (2,)
    assert "<|im_start|>" in (tok.chat_template or "")


def test_chat_template_text_and_ids(tok):
    msgs = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(msgs) == tok.encode(text, add_special_tokens=False)
    no_gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert not no_gen.endswith("assistant\n")


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_matches_full_decode(tok, text):
    ids = tok.encode(text)
    if not text.isascii():
        assert any("\ufffd" in tok.decode([i]) for i in ids), \
            "the text must contain tokens that split a UTF-8 character"
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add(i) for i in ids] + [detok.finish()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == text


def test_incremental_detokenizer_skips_special_tokens(tok):
    ids = tok.encode("a<|im_end|>b 🎉")
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    out = "".join(detok.add(i) for i in ids) + detok.finish()
    assert out == tok.decode(ids, skip_special_tokens=True) == "ab 🎉"


def test_incremental_detokenizer_flushes_a_broken_tail(tok):
    ids = tok.encode("x🎉")
    cut = ids[:-1]  # the emoji's bytes are split across tokens: stop mid-character
    detok = IncrementalDetokenizer(tok)
    streamed = "".join(detok.add(i) for i in cut)
    assert "\ufffd" not in streamed
    assert streamed + detok.finish() == tok.decode(cut)
