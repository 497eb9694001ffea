"""Through real servers: speculative decoding is lossless on the default model.

One plain server computes the reference (each prompt alone, greedy), then stops; then an NGRAM
server and a STANDALONE server (the default model drafting for itself) must give the same ids,
streamed and not, alone and 16 at once; STANDALONE accepts every draft token. Servers with
random drafts of every other algorithm (EAGLE, EAGLE3, NEXTN heads; DFlash and DSpark drafts; a
UNO LoRA adapter) give the same ids too, streamed and not, alone and 16 at once. Under a JSON
schema, NGRAM's accepted drafts advance the grammar like decoded tokens: the constrained
outputs equal the plain server's and validate. Bad speculative
set-ups end ``engine serve`` at start-up with exit status 2 and the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from conftest import running, start_server

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
TEXTS = ["The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat.",
         "Rivers carry water from the mountains to the sea, shaping valleys over many years.",
         "A good recipe lists every ingredient first, then each step in the order it is done.",
         "The library opens at nine in the morning and closes at six in the evening."]


def prompts() -> list[str]:
    """16 prompts: half ask to repeat or edit a given text (drafts match), half do not."""
    grounded = [f"Repeat the following text exactly.\n\n{t}\n\nRepeated text:\n" for t in TEXTS]
    grounded += [f"Rewrite the text in capital letters.\n\n{t}\n\nRewritten:\n" for t in TEXTS]
    free = [f"Write about {topic}. Answer:" for topic in (
        "the sea", "volcanoes", "jazz music", "honey bees", "old maps", "paper cranes",
        "desert rain", "city lights")]
    return grounded + free


def generate(client: httpx.Client, text: str, **extra: Any) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS},
            **extra}  # (extra's sampling_params replace the default ones)
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def stream(client: httpx.Client, text: str) -> dict[str, Any]:
    events = []
    with client.stream("POST", "/generate", json={
            "text": text, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS}}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    return json.loads(events[-2])


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "langs": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 4}},
    "required": ["name", "age", "langs"], "additionalProperties": False}
RECORDS = [{"name": "Ada", "age": 36, "langs": ["en", "fr"]},
           {"name": "Linus", "age": 54, "langs": ["fi", "sv", "en"]},
           {"name": "Grace", "age": 85, "langs": ["en"]}]


def constrained(client: httpx.Client, record: dict[str, Any]) -> dict[str, Any]:
    """Greedy, under SCHEMA, asked to repeat a record (its tokens are in the prompt: n-gram
    drafts match)."""
    text = f"Repeat the following JSON exactly.\n\n{json.dumps(record)}\n\nRepeated JSON:\n"
    return generate(client, text, sampling_params={
        "temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)})


def one_by_one(server) -> list[list[int]]:
    with server.client(timeout=600) as c:
        return [generate(c, p)["output_ids"] for p in prompts()]


def banned(client: httpx.Client, ids: list[int]) -> dict[str, Any]:
    """The first prompt, greedy, with the second token of its plain output ``ids`` banned by a
    logit bias (a grounded prompt: n-gram drafts keep proposing the banned token)."""
    return generate(client, prompts()[0], sampling_params={
        "temperature": 0, "max_new_tokens": MAX_TOKENS, "logit_bias": {str(ids[1]): -100}})


@pytest.fixture(scope="module")
def references() -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The plain server's ids: the prompts, the constrained records, the biased request."""
    with running(start_server("plain", "--max-running-requests", "16")) as s:
        plain = one_by_one(s["plain"])
        with s["plain"].client(timeout=600) as c:
            json_ids = [constrained(c, r)["output_ids"] for r in RECORDS]
            biased = banned(c, plain[0])["output_ids"]
        assert biased[0] == plain[0][0] and plain[0][1] not in biased
        return plain, json_ids, biased


@pytest.fixture(scope="module")
def reference(references) -> list[list[int]]:
    return references[0]


@pytest.fixture(scope="module")
def constrained_reference(references) -> list[list[int]]:
    return references[1]


def check_lossless(server, reference: list[list[int]]) -> list[dict[str, Any]]:
    ps = prompts()
    with server.client(timeout=600) as c:
        alone = [generate(c, p) for p in ps]
        streamed = [stream(c, p) for p in ps[:4] + ps[8:10]]
        c.post("/flush_cache")
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(
                lambda i: stream(c, ps[i]) if i % 2 else generate(c, ps[i]), range(16)))
        metrics = c.get("/metrics").text
    assert [r["output_ids"] for r in alone] == reference
    assert [r["output_ids"] for r in streamed] == reference[:4] + reference[8:10]
    assert [r["output_ids"] for r in together] == reference
    assert all(r["meta_info"]["spec_verify_ct"] >= 1 for r in alone[:8])
    lines = {ln.split("{")[0]: float(ln.split()[-1]) for ln in metrics.splitlines()
             if ln.startswith("engine_spec_")}
    assert lines["engine_spec_accepted_tokens_total"] > 0
    assert lines["engine_spec_accept_length"] > 1.0
    return alone


def check_plumbing(server, reference: list[list[int]]) -> list[dict[str, Any]]:
    """Random drafts (almost never right): the plain server's ids, four alone, two streamed,
    sixteen at once (every other one streamed); every request alone was verified."""
    ps = prompts()
    with server.client(timeout=600) as c:
        alone = [generate(c, p) for p in ps[:4]]
        streamed = [stream(c, p) for p in ps[4:6]]
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(
                lambda i: stream(c, ps[i]) if i % 2 else generate(c, ps[i]), range(16)))
    assert [r["output_ids"] for r in alone] == reference[:4]
    assert [r["output_ids"] for r in streamed] == reference[4:6]
    assert [r["output_ids"] for r in together] == reference
    assert all(r["meta_info"]["spec_verify_ct"] >= 1 for r in alone)
    return alone


def test_ngram_is_lossless_and_accepts_drafts_on_grounded_prompts(
        reference, constrained_reference, references):
    with running(start_server("ngram", "--max-running-requests", "16",
                              "--speculative-algorithm", "NGRAM")) as s:
        alone = check_lossless(s["ngram"], reference)
        with s["ngram"].client(timeout=600) as c:
            json_outs = [constrained(c, r) for r in RECORDS]
            biased = banned(c, reference[0])
    assert biased["output_ids"] == references[2]  # a logit bias holds on every draft node
    grounded = alone[:4]
    accepted = sum(r["meta_info"]["spec_accepted_tokens"] for r in grounded)
    assert accepted >= len(grounded) * MAX_TOKENS // 3
    # under a grammar: the same ids as without drafts, valid, and drafts were accepted
    assert [r["output_ids"] for r in json_outs] == constrained_reference
    for r in json_outs:
        assert r["meta_info"]["finish_reason"]["type"] == "stop", r["meta_info"]
        jsonschema.validate(json.loads(r["text"]), SCHEMA)
    assert sum(r["meta_info"]["spec_accepted_tokens"] for r in json_outs) > 0


def test_standalone_drafting_for_itself_accepts_every_draft(reference):
    from engine.models.config import resolve_model_path

    with running(start_server("standalone", "--max-running-requests", "16",
                              "--speculative-algorithm", "standalone",
                              "--speculative-draft-model-path", resolve_model_path(None))) as s:
        alone = check_lossless(s["standalone"], reference)
    for r in alone:
        meta = r["meta_info"]
        verified = meta["completion_tokens"] - 1  # the first token comes from the prefill
        # 3 drafts per verify, all accepted: 4 tokens per verify (the last verify may be cut)
        assert meta["spec_accepted_tokens"] + meta["spec_verify_ct"] == verified, meta
        if r["meta_info"]["finish_reason"]["type"] == "length":
            assert meta["spec_verify_ct"] == -(-verified // 4), meta


SMOL = {"hidden_size": 576, "intermediate_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "vocab_size": 49152}


@pytest.mark.parametrize("algo,arch,extra", [
    ("EAGLE", "LlamaForCausalLMEagle", ()),
    ("EAGLE3", "LlamaForCausalLMEagle3", ("--speculative-eagle-topk", "2",
                                          "--speculative-num-steps", "2",
                                          "--speculative-num-draft-tokens", "5")),
    ("NEXTN", "DeepseekV3ForCausalLMNextN", ())])
def test_eagle_family_heads_with_random_weights_are_lossless(reference, tmp_path, algo, arch,
                                                             extra):
    """Random EAGLE (a batched chain), EAGLE3 (an EAGLE-2 tree over a draft vocabulary of
    4,096) and NEXTN heads of the default model's width over its features."""
    cfg = {"architectures": [arch], **SMOL, "draft_vocab_size": 4096}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with running(start_server(algo.lower(), "--max-running-requests", "16",
                              "--speculative-algorithm", algo,
                              "--speculative-draft-model-path", str(tmp_path),
                              "--speculative-draft-load-format", "dummy", *extra)) as s:
        check_plumbing(s[algo.lower()], reference)


def test_dflash_with_a_random_draft_is_lossless(reference, tmp_path):
    """A DFlash draft with random weights (plumbing only: its drafts are almost never right)
    over the default model's layer features."""
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **SMOL, "block_size": 4,
           "dflash_config": {"target_layer_ids": [1, 15, 29], "mask_token_id": 0}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with running(start_server("dflash", "--max-running-requests", "16",
                              "--speculative-algorithm", "DFLASH",
                              "--speculative-draft-model-path", str(tmp_path),
                              "--speculative-draft-load-format", "dummy")) as s:
        check_plumbing(s["dflash"], reference)


def test_dspark_with_a_random_draft_is_lossless(reference, tmp_path):
    """A DSpark draft with random weights (a DFlash backbone and a gated Markov head) over the
    default model's layer features."""
    cfg = {"architectures": ["DSparkDraftModel"], "model_type": "qwen3", **SMOL, "block_size": 3,
           "dflash_config": {"target_layer_ids": [1, 15, 29], "mask_token_id": 0,
                             "markov_rank": 16, "markov_head_type": "gated"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with running(start_server("dspark", "--max-running-requests", "16",
                              "--speculative-algorithm", "DSPARK",
                              "--speculative-draft-model-path", str(tmp_path),
                              "--speculative-draft-load-format", "dummy")) as s:
        check_plumbing(s["dspark"], reference)


def test_uno_with_a_random_adapter_is_lossless(reference, tmp_path):
    """UNO over the default model with a random PEFT adapter read from disk (plumbing: the
    noise rows' drafts are almost never right, the first row's always is): at least one token
    accepted per verify that was not cut short."""
    from engine.testing.lora import write_adapter

    cfg = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64}
    lora = write_adapter(str(tmp_path / "uno"), cfg, rank=4, scale=0.05)
    with running(start_server("uno", "--max-running-requests", "16",
                              "--speculative-algorithm", "UNO", "--uno-lora-path", lora,
                              "--speculative-num-draft-tokens", "4")) as s:
        alone = check_plumbing(s["uno"], reference)
    for r in alone:
        meta = r["meta_info"]
        assert meta["spec_accepted_tokens"] >= meta["spec_verify_ct"] - 1, meta


# ---------------------------------------------------------------------- bad set-ups


def serve_error(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "engine.cli.main", "serve", "--device", "cpu",
                          "--max-total-tokens", "4096", "--port", "1", *args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    return out.stderr.strip().splitlines()[-1]


def tiny_model(tmp_path, vocab: int) -> str:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
           "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 16, "vocab_size": vocab,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_bad_speculative_setups_exit_2_with_the_reason(tmp_path):
    assert serve_error("--speculative-algorithm", "STANDALONE") == (
        "engine serve: error: --speculative-algorithm STANDALONE needs a draft model: set "
        "--speculative-draft-model-path")
    (tmp_path / "other").mkdir()
    (tmp_path / "empty").mkdir()
    other = tiny_model(tmp_path / "other", 1000)
    line = serve_error("--speculative-algorithm", "standalone", "--speculative-draft-model-path",
                       other, "--speculative-draft-load-format", "dummy")
    assert "its vocabulary has 1000 tokens, the target's 49152" in line
    empty = tiny_model(tmp_path / "empty", 49152)
    line = serve_error("--speculative-algorithm", "standalone", "--speculative-draft-model-path",
                       empty)
    assert line.startswith(f"engine serve: error: --speculative-draft-model-path {empty}: ")
    line = serve_error("--speculative-algorithm", "ngram", "--attention-backend",
                       "flex_attention")
    assert "drafts trees" in line and "cannot verify a tree" in line
