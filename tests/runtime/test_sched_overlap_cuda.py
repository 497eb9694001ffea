"""The overlap scheduler on a GPU (skipped without CUDA): a small Llama with dummy float32
weights behind the triton backend and CUDA graphs gives the same tokens, log-probabilities and
finish reasons with the overlap scheduler as with each step's tokens read back at once, for
a mix of greedy, seeded sampled, penalised, stop-id and one-token requests joining while others
run; the KV memory comes back whole."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from engine import Engine
from engine.config import ServerConfig
from engine.runtime.model_runner import ModelRunner
from engine.runtime.request import ReqOutput
from engine.runtime.sampling import SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
          "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1,
          "eos_token_id": 2}


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(CONFIG))
    torch.manual_seed(0)
    return ModelRunner(ServerConfig(model_path=str(path), load_format="dummy", device="cuda",
                                    dtype="float32", skip_tokenizer_init=True,
                                    attention_backend="triton", page_size=16,
                                    context_length=512, max_running_requests=16))


def run_mix(runner: ModelRunner, mix: list[tuple[list[int], dict[str, Any], int]],
            monkeypatch: pytest.MonkeyPatch, overlap: bool) -> tuple[dict[str, Any], int]:
    monkeypatch.setenv("ENGINE_OVERLAP_SCHEDULE", "1" if overlap else "0")
    engine = Engine(runner=runner)
    sched = engine.runtime.scheduler
    assert sched.overlap is overlap
    outs: dict[str, list[ReqOutput]] = {}
    pending = list(enumerate(mix))
    step = in_flight = 0
    while pending or sched.has_work:
        for item in list(pending):
            k, (ids, sp, at) = item
            if at <= step:
                pending.remove(item)
                reqs = engine.runtime.make_reqs(f"m{k}", ids, SamplingParams(**sp).validate(),
                                                lambda o: outs.setdefault(o.rid, []).append(o))
                sched.submit(reqs)
        sched.step()
        in_flight += sched._inflight is not None
        step += 1
        assert step < 500, "the scheduler did not go idle"
    sched.flush_cache()
    sched.step()
    assert sched.allocator.free_tokens == sched.allocator.capacity_tokens
    result = {}
    for rid, chunks in outs.items():
        assert chunks[-1].finished
        result[rid] = ([t for c in chunks for t in c.token_ids], chunks[-1].finish_reason,
                       chunks[-1].completion_tokens, [v for c in chunks for v in c.logprobs])
    return result, in_flight


def test_overlap_on_cuda_gives_what_reading_back_at_once_gives(runner, monkeypatch) -> None:
    prompts = [[(7 * i + 3 * j) % 500 + 3 for j in range(20 + 9 * i)] for i in range(6)]
    greedy = {"temperature": 0.0, "ignore_eos": True}
    probe, _ = run_mix(runner, [(prompts[0], {**greedy, "max_new_tokens": 12}, 0)],
                       monkeypatch, overlap=False)
    stop_id = probe["m0"][0][6]
    mix = [
        (prompts[0], {**greedy, "max_new_tokens": 40}, 0),
        (prompts[1], {"temperature": 0.9, "top_p": 0.9, "seed": 5, "max_new_tokens": 24,
                      "ignore_eos": True, "n": 2}, 0),
        (prompts[0], {"temperature": 0.0, "max_new_tokens": 30, "stop_token_ids": [stop_id]}, 2),
        (prompts[2], {**greedy, "max_new_tokens": 9, "logprobs": True, "top_logprobs": 2}, 3),
        (prompts[3], {**greedy, "max_new_tokens": 1}, 5),
        (prompts[4], {**greedy, "max_new_tokens": 10, "repetition_penalty": 1.3}, 20),
        (prompts[5], {"temperature": 0.7, "seed": 1, "top_k": 20, "max_new_tokens": 15,
                      "ignore_eos": True}, 8),
    ]
    sync, _ = run_mix(runner, mix, monkeypatch, overlap=False)
    over, in_flight = run_mix(runner, mix, monkeypatch, overlap=True)
    assert in_flight >= 20
    assert sync["m2"][1] == {"type": "stop", "matched": stop_id}
    for rid, (tokens, reason, count, logprobs) in sync.items():
        o_tokens, o_reason, o_count, o_logprobs = over[rid]
        assert (o_tokens, o_reason, o_count) == (tokens, reason, count), rid
        assert o_logprobs == pytest.approx(logprobs, abs=1e-4), rid
