"""Checks of the sampling kernel (engine.runtime.sample_triton) and the sampler's use of it, run
as a script: ``python sample_checks.py cpu`` (with TRITON_INTERPRET=1) or ``... cuda``. Prints a
JSON list of failures last (empty: all passed)."""

from __future__ import annotations

import json
import sys

import torch

from engine.runtime import sample_triton
from engine.runtime.sampling import (GREEDY_TEMPERATURE, SamplingParams, Sampler, _truncate,
                                     sample_args)

FAILURES: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        FAILURES.append(what)


class Row:
    """What the sampler reads of a request."""

    def __init__(self, params: SamplingParams, seed: int = 0, position: int = 0) -> None:
        self.sampling_params = params
        self.generator = None if params.is_greedy else torch.Generator().manual_seed(seed)
        self.origin_input_ids = [1, 2]
        self.output_ids = [3] * position
        self.stop_ids = frozenset()
        self.grammar = None
        self.logit_processor = None


def draw(logits: torch.Tensor, rows: list[Row]) -> list[int]:
    return sample_triton.sample(logits, *sample_args(rows, logits.device).unbind(0)).tolist()


def greedy(dev: str) -> None:
    x = torch.randn(4, 50, device=dev)
    x[1, 7] = float("nan")
    x[1, 9] = 50.0
    x[2] = float("-inf")
    x[3, :] = 1.0  # all tied: the first
    want = [int(x[0].argmax()), 9, 0, 0]
    rows = [Row(SamplingParams(temperature=0.0)), Row(SamplingParams(temperature=0.7, top_k=1)),
            Row(SamplingParams(temperature=0.0)), Row(SamplingParams(temperature=0.0))]
    check(draw(x, rows) == want, f"greedy rows: {draw(x, rows)} != {want}")
    # a sampled row of nothing but -inf/NaN takes column 0, as the torch sampler's fallback
    bad = torch.full((1, 50), float("nan"), device=dev)
    check(draw(bad, [Row(SamplingParams(temperature=1.0), 3)]) == [0], "all-NaN sampled row")
    cold = SamplingParams(temperature=GREEDY_TEMPERATURE * 10)
    check(draw(x[:1], [Row(cold, 5)]) == want[:1], "a near-zero temperature is the argmax")


CASES = [dict(), dict(top_k=5), dict(top_p=0.6), dict(min_p=0.3),
         dict(top_k=10, top_p=0.8, min_p=0.05)]


def distribution(dev: str, draws: int) -> None:
    """Many seeds over one row: every token drawn lies in the torch sampler's support, and the
    frequencies are close to its probabilities."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(1, 48, generator=gen) * 1.5).to(dev)
    for case in CASES:
        params = SamplingParams(temperature=0.9, **case)
        probs = _truncate(x.float().cpu() / 0.9, [params])[0]
        rows = [Row(params, seed, position=7) for seed in range(draws)]
        got = draw(x.expand(draws, -1).contiguous(), rows)
        support = set(torch.nonzero(probs > 0).flatten().tolist())
        check(set(got) <= support, f"{case}: drew outside the support")
        freq = torch.bincount(torch.tensor(got), minlength=48).float() / draws
        tv = 0.5 * float((freq - probs).abs().sum())
        # the distance a true sampler's frequencies keep on average (normal approximation)
        expect = 0.5 * float((2 * probs * (1 - probs) / (torch.pi * draws)).sqrt().sum())
        check(tv < 2 * expect + 0.02, f"{case}: total variation {tv:.3f} from the "
              f"probabilities (a true sampler: about {expect:.3f})")
        likely = {t for t in support if probs[t] > 0.05}
        check(likely <= set(got), f"{case}: likely tokens never drawn")


def determinism(dev: str) -> None:
    """A row's token depends on its seed and position only: not on its place in the batch or
    the other rows."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 64, generator=gen).to(dev)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    alone = draw(x, [Row(params, 42, 5)])
    others = [Row(SamplingParams(temperature=0.5, top_k=3), s, 2) for s in range(3)]
    mixed = draw(torch.cat([torch.randn(3, 64, generator=gen).to(dev), x]),
                 others + [Row(params, 42, 5)])
    check(mixed[3] == alone[0], "a row's draw changed with the rows beside it")
    check(draw(x, [Row(params, 42, 5)]) == alone, "same seed and position, another token")
    seq = draw(x.expand(16, -1).contiguous(), [Row(params, 42, p) for p in range(16)])
    check(len(set(seq)) > 1, "every position drew the same token")


def sampler(dev: str) -> None:
    """The sampler's kernel path: its own launch, the graph's tokens when no row's logits
    change, and not when one does."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 40, generator=gen).to(dev)
    rows = [Row(SamplingParams(temperature=0.8), 3, 1), Row(SamplingParams(temperature=0.0))]
    s = Sampler(kernel=True)
    out = s(x.clone(), rows)
    check(out.token_ids == draw(x, rows), "the sampler's kernel draw")
    given = torch.tensor([5, 6], device=dev)
    check(s(x.clone(), rows, given).token_ids == [5, 6], "the graph's tokens are taken")
    rows[1].sampling_params = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    check(s(x.clone(), rows, given).token_ids != [5, 6],
          "a penalised row's logits change: the graph's tokens must not be taken")
    forced = SamplingParams(temperature=0.8, logit_bias={"11": 100}).validate()
    rows[1].sampling_params = SamplingParams(temperature=0.0)
    check(s(x.clone(), [rows[0], Row(forced, 4, 2)], given).token_ids == [int(
        draw(x, rows)[0]), 11], "a biased row's logits change: its token is drawn from them")
    lp = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2)
    out = s(x[:1].clone(), [Row(lp)], given[:1])
    want = float(torch.log_softmax(x[:1].float(), -1)[0, 5])
    check(out.token_ids == [5] and abs(out.logprobs[0] - want) < 1e-5,
          "log-probabilities of the graph's token")


def unrolled(dev: str) -> None:
    """Several blocks a pass (``UNROLL``, the last pass partly past the row's end) draw the
    tokens one block a pass draws, greedy (a tie and the maximum in later blocks) and sampled
    (top-k, top-p, min-p), here with 16-column blocks over 200 columns."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(6, 200, generator=gen) * 2).to(dev)
    x[0, 150] = x[0, 182] = 30.0  # a tie in the last pass, in one lane two blocks apart
    x[1, 3] = float("nan")
    rows = [Row(SamplingParams(temperature=0.0)), Row(SamplingParams(temperature=0.0))]
    rows += [Row(SamplingParams(temperature=0.9, **case), 5 + i, 3)
             for i, case in enumerate(CASES[1:])]
    saved = sample_triton.BLOCK, sample_triton.UNROLL
    try:
        sample_triton.BLOCK = 16
        got = {}
        for unroll in (1, 8):
            sample_triton.UNROLL = unroll
            got[unroll] = draw(x, rows)
    finally:
        sample_triton.BLOCK, sample_triton.UNROLL = saved
    check(got[8] == got[1], f"unrolled passes drew {got[8]}, one block a pass {got[1]}")
    check(got[1][0] == 150, f"the first of two tied maxima: {got[1][0]}")


def main() -> None:
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    draws = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    for fn in (greedy, determinism, sampler, unrolled):
        fn(dev)
    distribution(dev, draws)
    print(json.dumps(FAILURES))


if __name__ == "__main__":
    main()
