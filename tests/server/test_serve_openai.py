"""The official ``openai`` client against a real server: chat, completions, streaming."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(main_server):
    return openai.OpenAI(base_url=main_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_chat_completion(client, model) -> None:
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=8,
        temperature=0)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream_and_reports_usage(client, model) -> None:
    kw = dict(model=model, messages=[{"role": "user", "content": "Name a colour."}],
              max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason and set(reasons[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_with_logprobs_and_n(client, model) -> None:
    r = client.completions.create(model=model, prompt="The sky is", max_tokens=5,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert all(v <= 0 for v in lp.token_logprobs) and len(lp.top_logprobs[0]) == 2
    assert "".join(lp.tokens) == r.choices[0].text
    many = client.completions.create(model=model, prompt=["A", "B"], max_tokens=3, n=2,
                                     temperature=0.8, seed=1)
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]


def test_completions_stream(client, model) -> None:
    whole = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6,
                                      temperature=0)
    parts = list(client.completions.create(model=model, prompt="Once upon a time",
                                           max_tokens=6, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"


def test_chat_logprobs(client, model) -> None:
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
        temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert len(content[0].top_logprobs) == 3
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob


def test_unknown_model_is_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", max_tokens=2,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert "no-such-model" in str(exc.value)


def test_logit_bias_bans_and_forces_tokens(client, model, main_server) -> None:
    import httpx

    body = {"input_ids": [1, 504, 3485, 314], "sampling_params": {
        "temperature": 0, "max_new_tokens": 4, "ignore_eos": True}}
    with httpx.Client(base_url=main_server.url, timeout=60) as c:
        plain = c.post("/generate", json=body).json()["output_ids"]
        body["sampling_params"]["logit_bias"] = {str(plain[0]): -100}
        banned = c.post("/generate", json=body).json()["output_ids"]
        body["sampling_params"]["logit_bias"] = {"1000": 100}
        forced = c.post("/generate", json=body).json()["output_ids"]
    assert banned[0] != plain[0] and plain[0] not in banned
    assert forced == [1000] * 4
    # the OpenAI endpoints: the completion's first token is the one the bias forces
    kw = dict(model=model, prompt="The sky is", max_tokens=2, temperature=0, logprobs=1)
    r = client.completions.create(**kw)
    first = r.choices[0].logprobs.tokens[0]
    other = client.completions.create(**kw, logit_bias={"1000": 100})
    forced_text = other.choices[0].logprobs.tokens[0]
    assert forced_text != first
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0,
        logit_bias={"1000": 100})
    assert chat.choices[0].message.content == forced_text * 2


def test_echo_with_logprobs_scores_the_prompt(client, model) -> None:
    """What evaluation harnesses send (echo, logprobs, max_tokens 0): every prompt token
    scored, the first null; the score of a token equals the logprob it had when generated."""
    made = client.completions.create(model=model, prompt="The sky is", max_tokens=2,
                                     temperature=0, logprobs=1)
    scored = client.completions.create(model=model, prompt="The sky is" + made.choices[0].text,
                                       max_tokens=0, echo=True, logprobs=1)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == "The sky is" + made.choices[0].text
    assert "".join(lp.tokens) == scored.choices[0].text and len(lp.tokens) == 5
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[3:] == pytest.approx(made.choices[0].logprobs.token_logprobs,
                                                  abs=1e-4)
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset == [0, 3, 7, 10, 12]
    # streamed: the prompt's scores come with the first event, the offsets run on
    events = list(client.completions.create(model=model, prompt="The sky is", max_tokens=2,
                                            echo=True, logprobs=1, temperature=0,
                                            stream=True))
    first = events[0].choices[0].logprobs
    assert first.tokens[:3] == ["The", " sky", " is"] and first.token_logprobs[0] is None
    tail = [t for e in events[1:] if e.choices and e.choices[0].logprobs
            for t in e.choices[0].logprobs.text_offset]
    assert (first.text_offset + tail)[3:] == [10, 12]


def test_tokenize_and_detokenize(main_server) -> None:
    import httpx

    with httpx.Client(base_url=main_server.url, timeout=60) as c:
        one = c.post("/tokenize", json={"prompt": "The sky is blue"}).json()
        assert one["count"] == len(one["tokens"]) > 2 and one["max_model_len"] == 8192
        many = c.post("/v1/tokenize", json={"prompt": ["a b", "The sky is blue"],
                                             "add_special_tokens": False}).json()
        assert many["tokens"][1] == one["tokens"] and many["count"] == [len(many["tokens"][0]),
                                                                        one["count"]]
        back = c.post("/detokenize", json={"tokens": one["tokens"]}).json()
        assert back == {"text": "The sky is blue"}
        both = c.post("/v1/detokenize", json={"tokens": many["tokens"]}).json()
        assert both == {"text": ["a b", "The sky is blue"]}
        assert c.post("/detokenize", json={"tokens": []}).json() == {"text": ""}
        bad = c.post("/detokenize", json={"tokens": [1, 10 ** 9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        assert c.post("/tokenize", json={}).json()["error"]["param"] == "prompt"
        other = c.post("/tokenize", json={"prompt": "x", "model": "gpt-9"})
        assert other.status_code == 404 and other.json()["error"]["param"] == "model"
