"""The sampler: penalties, truncation masks, greedy, seeds, logprobs; parameter validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from engine.runtime import sampling
from engine.runtime.sampling import (GREEDY_TEMPERATURE, InvalidParam, Sampler,
                                     SamplingParams, _truncated_probs)


@dataclass
class Row:
    sampling_params: SamplingParams
    origin_input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()
    generator: torch.Generator | None = None
    grammar: None = None


def row(seed: int | None = None, prompt: list[int] | None = None, out: list[int] | None = None,
        stop: frozenset[int] = frozenset(), **kw: object) -> Row:
    sp = SamplingParams(seed=seed, **kw).validate()  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return Row(sp, list(prompt or []), list(out or []), stop, gen)


def test_greedy_takes_the_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 1.0, 0.0]])
    out = Sampler()(logits, [row(temperature=0.0), row(top_k=1)])
    assert out.token_ids == [1, 0]
    assert out.logprobs is None


def test_greedy_ties_take_the_first_maximum_and_masked_ids_never_win() -> None:
    logits = torch.tensor([[1.0, 7.0, 7.0, 2.0], [float("-inf"), -5.0, -5.0, -9.0],
                           [4.0, 4.0, 4.0, 4.0]])
    out = Sampler()(logits, [row(temperature=0.0) for _ in range(3)])
    assert out.token_ids == [1, 1, 0]
    assert all(isinstance(t, int) for t in out.token_ids)
    masked = Sampler()(torch.tensor([[9.0, 1.0, 0.5]]),
                       [row(temperature=0.0, out=[], stop=frozenset({0}), min_new_tokens=1)])
    assert masked.token_ids == [1]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -1.0, 1.5, 0.5]])
    r = row(temperature=0.0, repetition_penalty=2.0, prompt=[0], out=[1])
    Sampler()(logits, [r])
    # token 0 (prompt) 2.0 -> 1.0; token 1 (output) -1.0 -> -2.0; others untouched
    assert logits.tolist() == [[1.0, -2.0, 1.5, 0.5]]


def test_repetition_penalty_changes_the_greedy_choice() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.0]])
    out = Sampler()(logits.clone(), [row(temperature=0.0, repetition_penalty=2.0, out=[0])])
    assert out.token_ids == [1]


def test_frequency_and_presence_penalties_count_generated_tokens_only() -> None:
    logits = torch.zeros(1, 4)
    r = row(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.25, prompt=[3],
            out=[1, 1, 2])
    Sampler()(logits, [r])
    assert logits.tolist() == [[0.0, -(2 * 0.5 + 0.25), -(0.5 + 0.25), 0.0]]


def test_min_new_tokens_masks_stop_ids_until_reached() -> None:
    logits = torch.tensor([[0.0, 10.0, 1.0]])
    early = row(temperature=0.0, min_new_tokens=2, max_new_tokens=5, out=[2],
                stop=frozenset({1}))
    assert Sampler()(logits.clone(), [early]).token_ids == [2]
    done = row(temperature=0.0, min_new_tokens=2, max_new_tokens=5, out=[2, 2],
               stop=frozenset({1}))
    assert Sampler()(logits.clone(), [done]).token_ids == [1]


def _mask(**kw: float) -> list[bool]:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    probs = _truncated_probs(logits, [SamplingParams(**kw).validate()])  # type: ignore[arg-type]
    return (probs[0] > 0).tolist()


def test_top_k_keeps_the_k_best() -> None:
    assert _mask(top_k=2) == [True, True, False, False]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    assert _mask(top_p=0.5) == [True, False, False, False]
    assert _mask(top_p=0.6) == [True, True, False, False]
    assert _mask(top_p=0.8) == [True, True, True, False]
    assert _mask(top_p=1.0) == [True, True, True, True]


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    assert _mask(min_p=0.4) == [True, True, False, False]  # 0.4 * 0.5 = 0.2


def test_truncated_probs_are_renormalised_and_keep_the_best_token() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    probs = _truncated_probs(logits, [SamplingParams(top_k=2).validate()])
    assert probs.sum().item() == pytest.approx(1.0)
    assert probs[0, 0].item() == pytest.approx(2 / 3)
    tiny = _truncated_probs(logits, [SamplingParams(top_p=1e-6).validate()])
    assert (tiny[0] > 0).tolist() == [True, False, False, False]


def test_temperature_sharpens_the_distribution() -> None:
    logits = torch.tensor([[1.0, 0.0]])
    hot = _truncated_probs(logits, [SamplingParams(temperature=2.0).validate()])
    cold = _truncated_probs(logits, [SamplingParams(temperature=0.5).validate()])
    assert cold[0, 0] > hot[0, 0]
    assert cold[0, 0].item() == pytest.approx(1 / (1 + math.exp(-2.0)))


def _draws(seed: int, neighbours: int) -> list[int]:
    torch.manual_seed(1234 + neighbours)  # the global RNG must not matter
    mine = torch.randn(1, 50, generator=torch.Generator().manual_seed(7))
    logits = torch.cat([mine, torch.randn(neighbours, 50)])
    rows = [row(seed=seed, temperature=1.0)] + [row(seed=99 + i, temperature=0.7, top_p=0.9)
                                                  for i in range(neighbours)]
    sampler, toks = Sampler(), []
    for _ in range(20):
        toks.append(sampler(logits.clone(), rows).token_ids[0])
    return toks


def test_same_seed_same_tokens_whatever_the_batch() -> None:
    alone = _draws(42, 0)
    assert alone == _draws(42, 3) == _draws(42, 7)
    assert alone != _draws(43, 0)


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    r = row(seed=0, temperature=1.0)
    counts = [0, 0, 0]
    for _ in range(2000):
        counts[Sampler()(logits.clone(), [r]).token_ids[0]] += 1
    assert abs(counts[0] / 2000 - 0.7) < 0.05 and abs(counts[2] / 2000 - 0.1) < 0.03


def test_logprobs_and_top_logprobs_are_the_models_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    out = Sampler()(logits.clone(), [row(temperature=0.0, logprobs=True, top_logprobs=2)])
    ref = torch.log_softmax(logits, -1)[0]
    assert out.token_ids == [0]
    assert out.logprobs == pytest.approx([ref[0].item()])
    assert [t for t, _ in out.top_logprobs[0]] == [0, 1]
    assert out.top_logprobs[0][1][1] == pytest.approx(ref[1].item())


def test_mixed_greedy_and_sampled_rows() -> None:
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 50.0]])
    out = Sampler()(logits, [row(temperature=0.0), row(seed=1, temperature=1.0)])
    assert out.token_ids == [1, 2]


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.5),
    ("max_new_tokens", -1), ("min_new_tokens", -1), ("repetition_penalty", 0.0),
    ("frequency_penalty", 3.0), ("presence_penalty", -2.5), ("n", 0), ("top_logprobs", 21),
    ("stop", [1]), ("stop_token_ids", [-1]), ("temperature", "hot"), ("seed", 1.5),
])
def test_invalid_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidParam) as exc:
        SamplingParams.from_dict({field: value})
    assert exc.value.param == field
    assert field in str(exc.value)


def test_from_dict_aliases_and_defaults() -> None:
    sp = SamplingParams.from_dict({"max_tokens": 5, "stop": "x", "temperature": None})
    assert sp.max_new_tokens == 5 and sp.stop == ["x"] and sp.temperature == 1.0
    with pytest.raises(InvalidParam) as exc:
        SamplingParams.from_dict({"bogus": 1})
    assert exc.value.param == "bogus"
    with pytest.raises(InvalidParam) as exc:
        SamplingParams.from_dict({"max_new_tokens": 2, "min_new_tokens": 3})
    assert exc.value.param == "min_new_tokens"


def test_penalties_and_min_tokens_apply_to_the_model_runners_inference_tensors() -> None:
    # the model runner returns its logits from inside torch.inference_mode(); the scheduler
    # samples outside it, and an in-place penalty must still work on them
    with torch.inference_mode():
        logits = torch.tensor([[2.0, -1.0, 1.5, 0.5], [1.0, 3.0, 0.0, 0.0]])
    rows = [row(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.5,
                presence_penalty=0.5, prompt=[0], out=[0, 2]),
            row(temperature=0.0, out=[], stop=frozenset({1}), min_new_tokens=2)]
    out = Sampler()(logits, rows)
    assert out.token_ids == [3, 0]


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty",
                                   "frequency_penalty", "presence_penalty"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**400])
def test_non_finite_floats_name_the_field(field: str, value: float) -> None:
    with pytest.raises(InvalidParam) as exc:
        SamplingParams.from_dict({field: value})
    assert exc.value.param == field and "finite" in str(exc.value)


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", 1e-300), ("repetition_penalty", 5e-5), ("repetition_penalty", 1e5),
    ("temperature", 1e5), ("seed", 10**30), ("seed", 2**63), ("seed", -2**63 - 1),
])
def test_values_outside_the_documented_ranges_name_the_field(field: str, value: float) -> None:
    with pytest.raises(InvalidParam) as exc:
        SamplingParams.from_dict({field: value})
    assert exc.value.param == field


def test_range_edges_are_accepted() -> None:
    for seed in (-2**63, 0, 2**63 - 1):
        assert SamplingParams.from_dict({"seed": seed}).seed == seed
    assert SamplingParams.from_dict({"repetition_penalty": 1e-4}).repetition_penalty == 1e-4
    assert SamplingParams.from_dict({"repetition_penalty": 1e4, "temperature": 1e4})


@pytest.mark.parametrize("temperature", [0.0, 1e-300, 1e-40, 9.9e-6])
def test_a_temperature_below_the_threshold_is_greedy(temperature: float) -> None:
    sp = SamplingParams(temperature=temperature).validate()
    assert sp.is_greedy
    logits = torch.tensor([[0.1, 3.0, 2.9], [5.0, 1.0, 0.0]])
    out = Sampler()(logits, [row(seed=1, temperature=temperature), row(temperature=1.0,
                                                                          seed=2)])
    assert out.token_ids[0] == 1 and not out.errors
    assert not SamplingParams(temperature=GREEDY_TEMPERATURE).validate().is_greedy


def test_rows_without_finite_probabilities_take_their_argmax() -> None:
    nan = float("nan")
    logits = torch.tensor([[nan, 1.0, 3.0, 2.0],     # NaN probabilities
                           [1.0, 2.0, 3.0, 0.5],     # every token masked: probabilities sum to 0
                           [0.0, 0.0, 50.0, 0.0]])   # a healthy sampled row
    rows = [row(seed=1, temperature=0.7),
            row(seed=2, temperature=0.7, stop=frozenset({0, 1, 2, 3}), min_new_tokens=1),
            row(seed=3, temperature=1.0)]
    out = Sampler()(logits, rows)
    assert out.token_ids == [2, 0, 2] and not out.errors
    greedy = Sampler()(torch.tensor([[nan, 1.0, 3.0], [nan, nan, nan]]),
                       [row(temperature=0.0), row(temperature=0.0)])
    assert greedy.token_ids == [2, 0]


def test_a_row_whose_preparation_raises_is_reported_and_the_others_are_unaffected(
        monkeypatch) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    rows = [row(seed=5, temperature=0.8), row(temperature=0.0, repetition_penalty=1.3,
                                              prompt=[1]),
            row(temperature=0.0, frequency_penalty=0.5, out=[2, 2])]
    alone = [Sampler()(logits[i:i + 1].clone(), [rows[i]]).token_ids[0] for i in (0, 2)]
    rows[0].generator.manual_seed(5)
    real = sampling._apply_penalties

    def faulty(lg: torch.Tensor, r: Row, vocab: int) -> None:
        if r.sampling_params.repetition_penalty == 1.3:
            raise RuntimeError("boom")
        real(lg, r, vocab)

    monkeypatch.setattr(sampling, "_apply_penalties", faulty)
    out = Sampler()(logits.clone(), rows)
    assert list(out.errors) == [1] and "boom" in str(out.errors[1])
    assert [out.token_ids[0], out.token_ids[2]] == alone


def test_logit_bias_is_added_before_penalties_and_changes_the_choice() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    r = row(temperature=0.0, logit_bias={"2": 5.0, 3: -100}, repetition_penalty=2.0, out=[2])
    out = Sampler()(logits, [r])
    # token 2: 0 + 5 = 5, then (generated) divided by 2 -> 2.5 beats token 0's 2.0
    assert logits.tolist() == [[2.0, 1.0, 2.5, -101.0]]
    assert out.token_ids == [2]


def test_logit_bias_can_ban_or_force_a_token_in_a_sampled_row() -> None:
    logits = torch.zeros(2, 8)
    banned = row(seed=3, temperature=1.0, logit_bias={str(t): -100 for t in range(7)})
    forced = row(seed=4, temperature=1.0, logit_bias={"5": 100})
    for _ in range(20):
        assert Sampler()(logits.clone(), [banned, forced]).token_ids == [7, 5]


def test_logit_bias_applies_to_its_row_alone_and_reaches_the_logprobs() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    biased = row(temperature=0.0, logit_bias={0: 3.0}, logprobs=True)
    plain = row(temperature=0.0, logprobs=True)
    out = Sampler()(logits.clone(), [biased, plain])
    assert out.token_ids == [0, 1]
    expected = torch.log_softmax(torch.tensor([3.0, 1.0, 0.0]), 0)[0].item()
    assert out.logprobs[0] == pytest.approx(expected)


@pytest.mark.parametrize("bias, message", [
    ({"7": 100.5}, "must be a number in [-100, 100]"),
    ({"7": float("nan")}, "must be a number"),
    ({"7": "5"}, "must be a number"),
    ({"7": True}, "must be a number"),
    ({"-1": 1}, "keys must be token ids"),
    ({"seven": 1}, "keys must be token ids"),
    ({"1.5": 1}, "keys must be token ids"),
    ({"1_0": 1}, "keys must be token ids"),
    ({" 7": 1}, "keys must be token ids"),
    ([1, 2], "must be an object"),
])
def test_invalid_logit_bias_names_the_field(bias: object, message: str) -> None:
    with pytest.raises(InvalidParam, match=r"logit_bias") as info:
        SamplingParams.from_dict({"logit_bias": bias})
    assert info.value.param == "logit_bias"
    assert message in str(info.value)


def test_logit_bias_keys_are_checked_against_the_vocabulary() -> None:
    sp = SamplingParams.from_dict({"logit_bias": {"9": 1, "10": -2}})
    assert sp.logit_bias == {9: 1.0, 10: -2.0}
    sp.validate(vocab_size=11)
    with pytest.raises(InvalidParam, match="below the vocabulary size 10"):
        sp.validate(vocab_size=10)
    assert SamplingParams.from_dict({"logit_bias": None}).logit_bias == {}


def test_logit_bias_beyond_the_logits_fails_its_row_alone() -> None:
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    out = Sampler()(logits, [row(temperature=0.0, logit_bias={5: 1.0}), row(temperature=0.0)])
    assert set(out.errors) == {0} and "logit_bias" in str(out.errors[0])
    assert out.token_ids[1] == 0


def test_token_ids_logprob_reports_the_chosen_tokens_of_each_row() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    rows = [row(temperature=0.0, logprobs=True, token_ids_logprob=[0, 2]), row(temperature=0.0)]
    out = Sampler()(logits.clone(), rows)
    lp = torch.log_softmax(logits, -1)
    assert [t for t, _ in out.ids_logprobs[0]] == [0, 2]
    assert [v for _, v in out.ids_logprobs[0]] == pytest.approx([lp[0, 0].item(),
                                                                 lp[0, 2].item()])
    merged = Sampler(batch_invariant=True)(logits.clone(), rows)
    assert merged.ids_logprobs[0] == out.ids_logprobs[0] and merged.ids_logprobs[1] == []
    with pytest.raises(InvalidParam, match="token_ids_logprob"):
        SamplingParams(token_ids_logprob=[1, 99]).validate(vocab_size=50)
    with pytest.raises(InvalidParam, match="token_ids_logprob"):
        SamplingParams.from_dict({"token_ids_logprob": [-1]})
