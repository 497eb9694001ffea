"""A mixture-of-experts model served end to end: a tiny random Qwen3-MoE checkpoint (written by
transformers, with the default model's tokenizer) behind ``engine serve``; its greedy output over
HTTP, streamed and not, equals transformers' on the same weights."""

from __future__ import annotations

import json
import os
import tempfile

import httpx
import pytest
import torch

from conftest import running, start_server

from engine.models.config import default_model_path

PROMPT = "The capital of France is"
TOKENS = 12


@pytest.fixture(scope="module")
def checkpoint() -> str:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=49152, hidden_size=64, intermediate_size=96,
                         moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                         norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         initializer_range=0.15, eos_token_id=2, bos_token_id=1,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    path = tempfile.mkdtemp(prefix="moe-serve-")
    Qwen3MoeForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    s = start_server("moe", "--model-path", checkpoint, "--tokenizer-path",
                     default_model_path(), "--dtype", "float32")
    with running(s) as started:
        yield started["moe"]


def test_greedy_over_http_equals_transformers_streamed_and_not(server, checkpoint):
    from transformers import AutoModelForCausalLM

    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": TOKENS,
                                                "ignore_eos": True}}
    with server.client() as c:
        whole = c.post("/generate", json=body).json()
        chunks = []
        with c.stream("POST", "/generate", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        info = c.get("/get_model_info").json()
    assert chunks[-1]["text"] == whole["text"]
    ids = whole["meta_info"].get("output_ids") or whole.get("output_ids")
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    from transformers import PreTrainedTokenizerFast

    d, f = os.path.split(default_model_path())
    tok = PreTrainedTokenizerFast.from_pretrained(d, gguf_file=f)
    prompt_ids = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=TOKENS, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(prompt_ids):].tolist()
    assert whole["text"] == tok.decode(want)
    if ids is not None:
        assert ids == want
    assert info["is_generation"] is True


def test_chat_completion_on_the_moe_model(server):
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
            "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5
