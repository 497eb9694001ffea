"""Log-probabilities of a prompt's own tokens: SGLang's input logprobs (``/generate`` with
``return_logprob`` and ``logprob_start_len`` >= 0) and the completions endpoint's ``echo``
with ``logprobs`` (what evaluation harnesses send to score a text).

A request asks for them from prompt position ``start`` (:attr:`SamplingParams.
logprob_start_len`): token ``p`` (``p >= start``) gets ``log P(prompt[p] | prompt[:p])``, the
model's own distribution (no bias, penalty or grammar: those shape the draws, not the prompt),
and token 0, which nothing predicts, gets None. The logits that give token ``p`` are those of
position ``p - 1``, so:

* the prefix cache may supply at most ``max(start, 1) - 1`` tokens of such a request
  (:func:`cache_limit`): the positions from there on are computed again;
* each extend step asks for the logits of the positions of its chunks that predict a prompt
  token (:func:`rows`), beside the rows that draw first output tokens; chunks are cut so that
  a step asks for at most :data:`MAX_ROWS` of them in all (:func:`chunk_cap`), so the float32
  logits of one step stay bounded;
* :func:`record` turns those rows into each request's values (and its ``top_logprobs``
  alternatives), on the host; they go out with the request's first output
  (:func:`take`), and a retracted request that prefills again does not record a position
  twice.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.runtime.sampling import pick_logprobs

#: most prompt positions whose logits one extend step computes to score them (all of its
#: requests together)
MAX_ROWS = 256


def wanted(req: Any) -> bool:
    """Whether ``req`` asked for its prompt's log-probabilities."""
    return req.sampling_params.logprob_start_len >= 0


def _first_row(req: Any) -> int:
    """The first position whose logits give a prompt token's log-probability."""
    return max(req.sampling_params.logprob_start_len, 1) - 1


def cache_limit(req: Any) -> int | None:
    """The most prompt tokens the prefix cache may supply to ``req`` (None: no limit, also
    once every position is scored: a retracted request need not compute its prompt again)."""
    if not wanted(req):
        return None
    first = _first_row(req) + len(req.input_logprobs)
    return first if first < len(req.origin_input_ids) - 1 else None


def rows(req: Any, start: int, n: int) -> range:
    """The positions in ``[start, start + n)`` (an extend chunk of ``req``) whose logits give
    a prompt token's log-probability not yet recorded."""
    if not wanted(req):
        return range(0)
    lo = max(start, _first_row(req) + len(req.input_logprobs))
    hi = min(start + n, len(req.origin_input_ids) - 1)
    return range(lo, max(lo, hi))


def chunk_cap(req: Any, start: int, n: int, left: int) -> int:
    """``n`` cut so that the chunk from ``start`` asks for at most ``left`` rows (at least
    one: ``left`` >= 1 where a request that scores is admitted into the step)."""
    if not wanted(req):
        return n
    first = rows(req, start, n)
    if len(first) <= left:
        return n
    return first.start + max(left, 1) - start


def record(picked: Sequence[tuple[Any, range]], logits: torch.Tensor) -> None:
    """Append to each request of ``picked`` (request, its positions, in the order of the rows
    of ``logits``) the log-probabilities of the prompt tokens those positions predict, and its
    ``top_logprobs`` best alternatives as (token id, log-probability) pairs."""
    targets: list[int] = []
    for req, positions in picked:
        targets.extend(req.origin_input_ids[q + 1] for q in positions)
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = pick_logprobs(lp, [[t] for t in targets])[:, 0].tolist()
    k = max(req.sampling_params.top_logprobs for req, _ in picked)
    top_v: list[list[float]] = []
    top_i: list[list[int]] = []
    if k > 0:
        vals, idx = lp.topk(min(k, lp.shape[1]), dim=-1)
        top_v, top_i = vals.tolist(), idx.tolist()
    ids = [list(req.sampling_params.token_ids_logprob) for req, positions in picked
           for _ in positions]
    chosen_ids = pick_logprobs(lp, ids).tolist() if any(ids) else []
    at = 0
    for req, positions in picked:
        want = req.sampling_params.top_logprobs
        for j in range(at, at + len(positions)):
            req.input_logprobs.append(chosen[j])
            req.input_top_logprobs.append(list(zip(top_i[j][:want], top_v[j][:want]))
                                          if want else [])
            req.input_ids_logprobs.append(list(zip(ids[j], chosen_ids[j])) if ids[j] else [])
        at += len(positions)


Pairs = list[list[tuple[int, float]]]


def take(req: Any) -> tuple[list[int], list[float | None], Pairs, Pairs] | None:
    """Once, with ``req``'s first output: (the prompt tokens from ``logprob_start_len`` on,
    their log-probabilities, their alternatives, their ``token_ids_logprob`` values; token
    0's are None, [] and []), else None."""
    if not wanted(req) or req.input_logprobs_sent:
        return None
    req.input_logprobs_sent = True
    start = min(req.sampling_params.logprob_start_len, len(req.origin_input_ids))
    head: list[float | None] = [None] if start == 0 else []
    none: Pairs = [[]] if start == 0 else []
    return (list(req.origin_input_ids[start:]), head + list(req.input_logprobs),
            none + list(req.input_top_logprobs), none + list(req.input_ids_logprobs))
