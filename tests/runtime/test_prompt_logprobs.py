"""Which prompt positions a request that scores its prompt asks logits for, per chunk; how
much of it the prefix cache may supply; what goes out with its first output."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from engine.runtime import prompt_logprobs as pl
from engine.runtime.sampling import InvalidParam, SamplingParams


@dataclass
class Req:
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    input_ids_logprobs: list = field(default_factory=list)
    input_logprobs_sent: bool = False


def req(n: int, start: int, top: int = 0, ids: list[int] | None = None) -> Req:
    return Req(list(range(10, 10 + n)), SamplingParams(
        logprob_start_len=start, top_logprobs=top, token_ids_logprob=ids or []).validate())


def test_positions_whose_logits_score_a_prompt_token() -> None:
    r = req(10, 0)
    assert pl.cache_limit(r) == 0  # position 0's logits score token 1
    assert list(pl.rows(r, 0, 10)) == list(range(9))  # the last position draws, not scores
    assert list(pl.rows(r, 0, 4)) + list(pl.rows(r, 4, 6)) == list(range(9))
    late = req(10, 6)
    assert pl.cache_limit(late) == 5 and list(pl.rows(late, 5, 5)) == [5, 6, 7, 8]
    assert list(pl.rows(late, 0, 5)) == []
    assert pl.cache_limit(req(10, -1)) is None and list(pl.rows(req(10, -1), 0, 10)) == []


def test_recorded_positions_are_not_asked_for_again_after_a_retraction() -> None:
    r = req(10, 0)
    pl.record([(r, pl.rows(r, 0, 4))], torch.zeros(4, 32))
    assert len(r.input_logprobs) == 4
    assert list(pl.rows(r, 0, 10)) == [4, 5, 6, 7, 8]  # (prefilled again from 0)
    assert pl.cache_limit(r) == 4  # (the cache may supply what was scored)
    pl.record([(r, pl.rows(r, 4, 6))], torch.zeros(5, 32))
    assert pl.cache_limit(r) is None and list(pl.rows(r, 0, 10)) == []


def test_a_chunk_asks_for_at_most_the_rows_left() -> None:
    r = req(10, 0)
    assert pl.chunk_cap(r, 0, 10, 3) == 3
    assert pl.chunk_cap(req(10, 7), 0, 10, 3) == 10  # rows 6, 7, 8: three
    assert pl.chunk_cap(req(10, 4), 0, 10, 3) == 6  # rows 3 .. 8: cut after row 5
    assert pl.chunk_cap(req(10, 4), 0, 10, 0) == 4  # (always one row's progress)
    assert pl.chunk_cap(req(10, -1), 0, 10, 0) == 10


def test_record_and_take_give_the_model_distribution_once() -> None:
    torch.manual_seed(0)
    r = req(5, 0, top=2)
    logits = torch.randn(4, 32)
    pl.record([(r, pl.rows(r, 0, 5))], logits)
    lp = torch.log_softmax(logits, -1)
    assert r.input_logprobs == pytest.approx([lp[q, 10 + q + 1].item() for q in range(4)])
    best = lp[0].topk(2)
    assert r.input_top_logprobs[0] == [(int(best.indices[0]), pytest.approx(best.values[0]
                                                                            .item())),
                                       (int(best.indices[1]), pytest.approx(best.values[1]
                                                                            .item()))]
    ids, values, tops, picked = pl.take(r)
    assert ids == r.origin_input_ids and values[0] is None and tops[0] == []
    assert values[1:] == r.input_logprobs and len(tops) == 5 and picked == [[]] * 5
    assert pl.take(r) is None  # (only with the first output)
    later = req(5, 3, ids=[7, 3])
    logits = torch.randn(2, 32)
    pl.record([(later, pl.rows(later, 2, 3))], logits)
    ids, values, _, picked = pl.take(later)
    assert ids == [13, 14] and len(values) == 2 and None not in values
    lp = torch.log_softmax(logits, -1)
    assert [[t for t, _ in p] for p in picked] == [[7, 3], [7, 3]]
    assert [v for _, v in picked[1]] == pytest.approx([lp[1, 7].item(), lp[1, 3].item()])


def test_logprob_start_len_is_checked() -> None:
    with pytest.raises(InvalidParam, match="logprob_start_len must be >= -1"):
        SamplingParams(logprob_start_len=-2).validate()
