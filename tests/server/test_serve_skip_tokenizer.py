"""``--skip-tokenizer-init``: the server starts without a tokenizer, /generate takes and returns
token ids (greedy ids equal to a tokenizer-backed server's), and every text input is a clear 400."""

from __future__ import annotations

import pytest

from conftest import running, start_server

IDS = [1, 504, 3458, 282, 4649, 314]


@pytest.fixture(scope="module")
def servers():
    with running(start_server("skip", "--skip-tokenizer-init"),
                 start_server("tok")) as started:
        yield started


def test_token_ids_in_token_ids_out(servers):
    body = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                  "ignore_eos": True}}
    with servers["skip"].client() as c:
        got = c.post("/generate", json=body)
    with servers["tok"].client() as c:
        want = c.post("/generate", json=body)
    assert got.status_code == 200, got.text
    assert got.json()["output_ids"] == want.json()["output_ids"]
    assert got.json()["text"] == ""
    with servers["skip"].client() as c:
        assert c.get("/health_generate").status_code == 200


@pytest.mark.parametrize("path,body,param", [
    ("/generate", {"text": "hello"}, "text"),
    ("/v1/completions", {"prompt": "hello"}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ("/tokenize", {"prompt": "hello"}, "prompt"),
    ("/v1/detokenize", {"tokens": [1, 2]}, "tokens"),
])
def test_text_inputs_are_refused_naming_the_field(servers, path, body, param):
    with servers["skip"].client() as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "--skip-tokenizer-init" in err["message"]
