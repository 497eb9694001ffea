"""``--is-embedding``: ``/v1/embeddings`` on one embedding server (OpenAI's request forms, base64,
refused ``dimensions``, usage), equal to transformers' final hidden state at the last token
(after the final norm, normalized) on the same weights; generation routes refused there, and
``/v1/embeddings`` refused on a generation server."""

from __future__ import annotations

import base64
import struct
from typing import Iterator

import pytest
import torch

from conftest import Server, running, start_server

TEXTS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b",
         "Quiet meadows hum softly"]
ATOL = 1e-4  #: against transformers, per component of a unit vector (measured: under 1e-6)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running(start_server("embedding", "--is-embedding", "--max-running-requests",
                              "4", "--gguf-activations", "float32")) as s:
        yield s["embedding"]


def _embed(server: Server, **body) -> dict:
    with server.client() as c:
        r = c.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def reference() -> list[tuple[list[int], torch.Tensor]]:
    """transformers' token ids and normalized last-token final hidden state of every text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.assembly import Assembly
    from engine.config import ServerConfig

    mc = Assembly(ServerConfig()).model_config()
    tok = AutoTokenizer.from_pretrained(mc.model_path, gguf_file=mc.gguf_file)
    hf = AutoModelForCausalLM.from_pretrained(mc.model_path, gguf_file=mc.gguf_file,
                                              dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for text in TEXTS:
            ids = tok.encode(text)
            last = hf.model(torch.tensor([ids])).last_hidden_state[0, -1]
            out.append((ids, torch.nn.functional.normalize(last, dim=-1)))
    return out


def test_embeddings_equal_transformers_last_token_hidden_state(server, reference):
    got = _embed(server, input=TEXTS)
    assert [d["index"] for d in got["data"]] == [0, 1, 2]
    assert got["object"] == "list" and got["data"][0]["object"] == "embedding"
    assert got["usage"] == {"prompt_tokens": sum(len(ids) for ids, _ in reference),
                            "total_tokens": sum(len(ids) for ids, _ in reference)}
    for d, (_, want) in zip(got["data"], reference):
        vec = torch.tensor(d["embedding"])
        assert vec.shape == want.shape
        assert abs(float(vec.norm()) - 1.0) < 1e-5
        assert torch.allclose(vec, want, atol=ATOL, rtol=0), (vec - want).abs().max()


def test_input_forms_and_base64(server, reference):
    ids = [ids for ids, _ in reference]
    one = _embed(server, input=TEXTS[0])["data"][0]["embedding"]
    by_ids = _embed(server, input=ids[0])
    batch_ids = _embed(server, input=ids[:2])
    packed = _embed(server, input=TEXTS[0], encoding_format="base64")["data"][0]["embedding"]
    full = _embed(server, input=TEXTS[0], dimensions=len(one))
    assert by_ids["usage"]["prompt_tokens"] == len(ids[0])
    assert torch.allclose(torch.tensor(by_ids["data"][0]["embedding"]), torch.tensor(one),
                          atol=1e-5, rtol=0)
    assert len(batch_ids["data"]) == 2
    assert torch.allclose(torch.tensor(batch_ids["data"][1]["embedding"]),
                          reference[1][1], atol=ATOL, rtol=0)
    raw = base64.b64decode(packed)
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == one, "float32 little-endian bytes"
    assert full["data"][0]["embedding"] == one


@pytest.mark.parametrize("body,param", [
    ({"input": TEXTS[0], "dimensions": 64}, "dimensions"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": TEXTS[0], "encoding_format": "int8"}, "encoding_format"),
    ({"input": [10**9]}, "input"),
])
def test_bad_embedding_requests_are_400_naming_the_field(server, body, param):
    with server.client() as c:
        r = c.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_generation_routes_are_refused_on_an_embedding_server(server):
    with server.client() as c:
        answers = [c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}),
                   c.post("/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "Hi"}]}),
                   c.post("/generate", json={"text": "Hi"})]
        info = c.get("/get_model_info").json()
        health = c.get("/health_generate")
    for r in answers:
        assert r.status_code == 400 and "--is-embedding" in r.json()["error"]["message"]
        assert "/v1/embeddings" in r.json()["error"]["message"]
    assert info["is_generation"] is False and health.status_code == 200
