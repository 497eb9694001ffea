"""The default model through ModelRunner equals Hugging Face transformers on the same weights.

Both sides run float32 from the same GGUF (transformers dequantizes it with ``gguf_file=``);
greedy decoding of 64 tokens must match token for token, and the prompts' last-position logits
must agree within 1e-3 (measured: about 3e-5).
"""

from __future__ import annotations

import pytest
import torch

from _default_model import default_runner, greedy

pytestmark = pytest.mark.slow

STEPS = 64
LOGITS_ATOL = 1e-3
PLAIN = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci"]
CHAT = [[{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Name three colours of the rainbow."}]]


@pytest.fixture(scope="module")
def runner():
    return default_runner()


@pytest.fixture(scope="module")
def prompts(runner):
    tok = runner.tokenizer
    return [tok.encode(p) for p in PLAIN] + [tok.apply_chat_template(m) for m in CHAT]


@pytest.fixture(scope="module")
def reference(runner, prompts):
    """transformers' greedy ids, last-position logits and the log-probabilities of each
    prompt's tokens 1.. for every prompt."""
    from transformers import AutoModelForCausalLM

    mc = runner.model_config
    hf = AutoModelForCausalLM.from_pretrained(mc.model_path, gguf_file=mc.gguf_file,
                                              dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            every = hf(x).logits[0]
            scores = torch.log_softmax(every[:-1], -1).gather(1, x[0, 1:, None])[:, 0]
            gen = hf.generate(x, max_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                              pad_token_id=0, attention_mask=torch.ones_like(x))
            out.append((gen[0, len(ids):].tolist(), every[-1], scores))
    return out


def test_greedy_64_tokens_match_transformers_one_at_a_time(runner, prompts, reference):
    for i, ids in enumerate(prompts):
        ours, logits = greedy(runner, [ids], STEPS)
        want, want_logits, _ = reference[i]
        assert ours[0] == want, f"prompt {i}: {runner.tokenizer.decode(ours[0])!r} != " \
                                f"{runner.tokenizer.decode(want)!r}"
        assert torch.allclose(logits[0], want_logits, atol=LOGITS_ATOL, rtol=0), \
            (logits[0] - want_logits).abs().max()


def test_batched_ragged_decode_matches_transformers(runner, prompts, reference):
    ours, logits = greedy(runner, prompts, STEPS)
    for i in range(len(prompts)):
        assert ours[i] == reference[i][0], f"prompt {i} differs when batched"
        assert torch.allclose(logits[i], reference[i][1], atol=LOGITS_ATOL, rtol=0)


def test_prompt_logprobs_match_transformers(runner, prompts, reference):
    """The prompt's own log-probabilities (``logprob_start_len`` 0), scored over chunks of 5
    tokens by the scheduler, are transformers' on every position."""
    from engine import Engine

    engine = Engine(runner=runner, disable_radix_cache=True, chunked_prefill_size=5)
    outs = engine.generate(prompts, {"max_new_tokens": 0, "logprob_start_len": 0})
    for i, (ids, out) in enumerate(zip(prompts, outs)):
        meta = out["meta_info"]
        assert meta["input_token_ids"] == ids and meta["input_token_logprobs"][0] is None
        got = torch.tensor(meta["input_token_logprobs"][1:])
        assert torch.allclose(got, reference[i][2], atol=2 * LOGITS_ATOL, rtol=0), \
            (got - reference[i][2]).abs().max()


def test_chunked_extend_equals_one_extend(runner, prompts):
    ids = prompts[1] + prompts[2]  # long enough for 3 uneven chunks
    one, logits_one = greedy(runner, [ids], 8)
    for chunks in (2, 3):
        many, logits_many = greedy(runner, [ids], 8, chunks=chunks)
        assert many == one
        assert torch.allclose(logits_many, logits_one, atol=1e-4, rtol=0)


def test_runner_contract(runner):
    assert runner.dtype == torch.float32 and runner.device.type == "cpu"
    assert runner.req_to_token.shape == (8, runner.max_context_len)
    assert runner.req_to_token.dtype == torch.int64
    assert runner.max_context_len == 8192
    assert runner.pool.num_slots >= 8192 and runner.max_total_num_tokens >= 8192
    assert runner.attention_backend_names == ("torch_native", "torch_native")
    assert runner.prefill_backend is runner.decode_backend
    assert runner.tokenizer.eos_token_ids == (2,)
