"""Sampling parameters and the batched sampler.

:class:`SamplingParams` is what a request asks for (SGLang/vLLM vocabulary); ``validate()``
raises :class:`InvalidParam` (a ``ValueError``) naming the offending field. Every float must
be finite (``inf``/``nan`` are refused), and:

* ``temperature`` in ``[0, MAX_TEMPERATURE]``; below ``GREEDY_TEMPERATURE`` (1e-5, as vLLM
  and SGLang) the request is greedy, so no division by a zero or denormal float32 happens;
* ``repetition_penalty`` in ``[MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY]``
  (1e-4 .. 1e4): dividing or multiplying float32 logits by it keeps them finite;
* ``frequency_penalty``/``presence_penalty`` in ``[-2, 2]``, ``top_p`` in ``(0, 1]``,
  ``min_p`` in ``[0, 1]``;
* ``seed`` a signed 64-bit integer (``-2**63 <= seed < 2**63``); ``n`` at least 1 (how many
  sequences one request may ask for is the server's ``--max-sequences-per-request``);
* ``logit_bias`` maps token ids (integers, or their decimal strings as JSON objects carry them)
  below the vocabulary size to finite biases in ``[-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]``
  (OpenAI's -100 .. 100), at most ``MAX_LOGIT_BIAS_TOKENS`` of them.

:class:`Sampler` turns one float32 logits row per request into one token, in this order:

1. ``logit_bias``: each listed token's bias is added to its logit (OpenAI's definition: -100
   in effect bans a token, 100 forces it; it reads no generated token, so it is applied
   alike at every step and in every draft node of speculative decoding); then penalties:
   ``repetition_penalty`` over prompt and generated tokens (a positive logit is
   divided by it, a negative one multiplied); ``frequency_penalty`` times each token's count in
   the generated tokens and ``presence_penalty`` once per generated token are subtracted
   (OpenAI's definition); ``min_new_tokens`` masks the stop/eos tokens until reached; a row's
   custom logit processor (:mod:`engine.runtime.logit_processors`) then runs;
   a constrained row (one with a grammar matcher) then keeps only the tokens its grammar
   allows (the others' logits become ``-inf``; the mask is the one computed ahead during the
   forward when there is one, see :class:`~engine.runtime.grammar.MaskPrefetcher`); a row
   whose grammar allows nothing fails with :class:`~engine.runtime.grammar.GrammarDeadEnd`;
2. log-probabilities (``logprobs``/``top_logprobs``) are taken here, from the penalised and
   masked logits before temperature and truncation: the model's own distribution, restricted
   to what the grammar allows (as SGLang, which applies the vocabulary mask with the
   penalties); ``top_logprobs`` never list a token that cannot be drawn (``-inf``);
3. greedy rows (``temperature < GREEDY_TEMPERATURE`` or ``top_k == 1``) take the argmax;
4. other rows divide by the temperature, then keep the ``top_k`` best, then the smallest set
   whose probability reaches ``top_p``, then drop tokens below ``min_p`` times the best
   probability, and draw with the request's own ``torch.Generator`` (on a GPU: the sampling
   kernel of :mod:`engine.runtime.sample_triton`, one launch for the batch, greedy rows
   included, drawing by Philox keyed by the request's seed and the token's position): a
   request's draws never depend on the other requests in its batch, so one seed gives one
   output.

Guarantees: no NaN or infinite probability reaches a draw (a row whose probabilities are not
finite or sum to zero takes the argmax of its logits instead, and an argmax never picks a NaN
logit); a row whose own preparation (penalties, masks) or draw raises is reported in
:attr:`SampleOutput.errors` and the other rows are sampled as if it were not there.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from engine.api.grammar import allocate_token_bitmask, apply_token_bitmask_inplace
from engine.runtime.batch import pack_to_device, to_device
from engine.runtime.grammar import GrammarDeadEnd

GREEDY_TEMPERATURE = 1e-5  #: a lower temperature means greedy
MAX_TEMPERATURE = 1e4
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-4, 1e4
SEED_RANGE = (-2**63, 2**63 - 1)  #: inclusive
MAX_LOGIT_BIAS = 100.0  #: a bias's largest magnitude (OpenAI's range)
MAX_LOGIT_BIAS_TOKENS = 1 << 16  #: the most tokens one request may bias
MAX_TOKEN_IDS_LOGPROB = 1024  #: the most tokens whose log-probabilities a request may ask for


class InvalidParam(ValueError):
    """A sampling parameter is out of range; ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    """Per-request sampling and stopping options. ``None`` scalars mean "the default"."""

    max_new_tokens: int | None = 128  #: None: up to the context length
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  #: -1 (or 0): the whole vocabulary
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    skip_special_tokens: bool = True
    #: token id -> bias added to its logit before penalties (keys may arrive as strings)
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: >= 0: also the log-probabilities of the prompt's tokens from this position on
    #: (:mod:`engine.runtime.prompt_logprobs`); -1: none
    logprob_start_len: int = -1
    #: tokens whose log-probabilities every scored position reports (SGLang's
    #: ``token_ids_logprob``: e.g. a classifier's label tokens), with ``logprobs``
    token_ids_logprob: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "SamplingParams":
        """Build from a JSON-like dict; unknown keys and wrong types raise :class:`InvalidParam`.

        Accepts the aliases ``max_tokens``, ``min_tokens`` and ``sampling_seed``; a string
        ``stop`` becomes a one-element list; ``None`` values keep the defaults.
        """
        data = dict(data or {})
        for alias, name in (("max_tokens", "max_new_tokens"), ("min_tokens", "min_new_tokens"),
                            ("sampling_seed", "seed")):
            if alias in data:
                value = data.pop(alias)
                if data.get(name) is None:
                    data[name] = value
        names = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                raise InvalidParam(key, f"unknown sampling parameter {key!r}")
            if value is None and key not in ("max_new_tokens", "seed"):
                continue
            kwargs[key] = value
        params = cls(**kwargs)
        params.validate()
        return params

    def validate(self, vocab_size: int | None = None) -> "SamplingParams":
        """Check types and ranges (normalising ``stop`` to a list); return ``self``."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check_int(self, "max_new_tokens", 0, allow_none=True)
        _check_int(self, "min_new_tokens", 0)
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise InvalidParam("min_new_tokens", f"min_new_tokens ({self.min_new_tokens}) must "
                               f"not exceed max_new_tokens ({self.max_new_tokens})")
        _check_float(self, "temperature", lo=0.0, hi=MAX_TEMPERATURE)
        _check_float(self, "top_p", lo=0.0, lo_open=True, hi=1.0)
        _check_int(self, "top_k", -1)
        _check_float(self, "min_p", lo=0.0, hi=1.0)
        _check_float(self, "repetition_penalty", lo=MIN_REPETITION_PENALTY,
                     hi=MAX_REPETITION_PENALTY)
        _check_float(self, "frequency_penalty", lo=-2.0, hi=2.0)
        _check_float(self, "presence_penalty", lo=-2.0, hi=2.0)
        _check_int(self, "seed", SEED_RANGE[0], SEED_RANGE[1], allow_none=True)
        _check_int(self, "n", 1)
        _check_int(self, "top_logprobs", 0, 20)
        _check_int(self, "logprob_start_len", -1)
        ids = self.token_ids_logprob
        if not isinstance(ids, list) or len(ids) > MAX_TOKEN_IDS_LOGPROB or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 and (
                    vocab_size is None or t < vocab_size) for t in ids):
            below = f" below the vocabulary size {vocab_size}" if vocab_size is not None else ""
            raise InvalidParam("token_ids_logprob", f"token_ids_logprob must be a list of at "
                               f"most {MAX_TOKEN_IDS_LOGPROB} token ids{below}")
        for name in ("ignore_eos", "logprobs", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidParam(name, f"{name} must be a boolean")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidParam("stop", "stop must be a string or a list of strings")
        if any(s == "" for s in self.stop):
            raise InvalidParam("stop", "stop strings must not be empty")
        if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0
                for t in self.stop_token_ids):
            raise InvalidParam("stop_token_ids", "stop_token_ids must be a list of token ids")
        if vocab_size is not None and any(t >= vocab_size for t in self.stop_token_ids):
            raise InvalidParam("stop_token_ids", f"stop_token_ids must be below the vocabulary "
                               f"size {vocab_size}")
        self.logit_bias = _checked_bias(self.logit_bias, vocab_size)
        return self

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def bias_tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``logit_bias`` as (token ids int64, biases float32) on ``device`` and the largest
        id, built once per device (a request's params do not change once it is admitted)."""
        cached = self.__dict__.get("_bias_cache")
        if cached is None or cached[0].device != device:
            ids, vals = zip(*sorted(self.logit_bias.items()))
            cached = (torch.tensor(ids, dtype=torch.long, device=device),
                      torch.tensor(vals, dtype=torch.float32, device=device), ids[-1])
            self.__dict__["_bias_cache"] = cached
        return cached


def _checked_bias(bias: Any, vocab_size: int | None) -> dict[int, float]:
    """``logit_bias`` with integer keys and float values, or :class:`InvalidParam`."""
    if not isinstance(bias, dict):
        raise InvalidParam("logit_bias", "logit_bias must be an object mapping token ids to "
                           "biases")
    if len(bias) > MAX_LOGIT_BIAS_TOKENS:
        raise InvalidParam("logit_bias", f"logit_bias may list at most {MAX_LOGIT_BIAS_TOKENS} "
                           f"tokens, got {len(bias)}")
    out: dict[int, float] = {}
    for key, value in bias.items():
        tok = int(key) if isinstance(key, str) and key.isascii() and key.isdecimal() else key
        if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0 or (
                vocab_size is not None and tok >= vocab_size):
            limit = f" below the vocabulary size {vocab_size}" if vocab_size is not None else ""
            raise InvalidParam("logit_bias", f"logit_bias keys must be token ids{limit}, got "
                               f"{key!r}")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                not math.isfinite(value) or abs(value) > MAX_LOGIT_BIAS:
            raise InvalidParam("logit_bias", f"logit_bias[{key!r}] must be a number in "
                               f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {value!r}")
        out[tok] = float(value)
    return out


def _check_int(p: SamplingParams, name: str, lo: int | None, hi: int | None = None, *,
               allow_none: bool = False) -> None:
    value = getattr(p, name)
    if value is None and allow_none:
        return
    if isinstance(value, float) and value.is_integer():
        value = int(value)
        setattr(p, name, value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidParam(name, f"{name} must be an integer, got {value!r}")
    if lo is not None and value < lo:
        raise InvalidParam(name, f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise InvalidParam(name, f"{name} must be <= {hi}, got {value}")


def _check_float(p: SamplingParams, name: str, *, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False) -> None:
    value = getattr(p, name)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidParam(name, f"{name} must be a number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float's range
        value = math.inf
    if not math.isfinite(value):
        raise InvalidParam(name, f"{name} must be a finite number, got {value}")
    setattr(p, name, value)
    if lo is not None and (value < lo or (lo_open and value == lo)):
        bound = f"> {lo}" if lo_open else f">= {lo}"
        raise InvalidParam(name, f"{name} must be {bound}" + (f" and <= {hi}" if hi else "")
                           + f", got {value}")
    if hi is not None and value > hi:
        raise InvalidParam(name, f"{name} must be <= {hi}, got {value}")


class SamplingRow(Protocol):
    """What the sampler reads of one request (the scheduler's request satisfies it)."""

    sampling_params: SamplingParams
    generator: torch.Generator | None
    origin_input_ids: list[int]
    output_ids: list[int]
    #: token ids that end the request (eos unless ignored, plus ``stop_token_ids``)
    stop_ids: frozenset[int]
    #: the request's :class:`engine.api.grammar.GrammarMatcher`, or None (unconstrained)
    grammar: Any
    #: the request's :class:`engine.runtime.logit_processors.ChosenProcessor`, or None
    logit_processor: Any
    #: optional: its next mask computed ahead (:class:`engine.runtime.grammar.PendingMask`)
    grammar_mask: Any


@dataclass
class SampleOutput:
    """One sampled token per row, with its log-probability and the top alternatives."""

    token_ids: list[int]
    logprobs: list[float] | None = None  #: set when any row asked for logprobs
    top_logprobs: list[list[tuple[int, float]]] | None = None
    #: each row's ``token_ids_logprob`` as (id, log-probability) pairs, when any row asked
    ids_logprobs: list[list[tuple[int, float]]] | None = None
    #: rows whose own preparation or draw raised (their ``token_ids`` entry means nothing)
    errors: dict[int, Exception] = field(default_factory=dict)


@dataclass
class Drawn:
    """The tokens of one sampling call, still where the logits were (on a GPU: not yet read).

    ``to_host()`` starts copying them to pinned host memory behind the sampling kernels and
    records :attr:`event`; ``result()`` then waits for that copy only, not for whatever the
    device was given after it (the overlap scheduler launches the next forward in between).
    :attr:`token_ids` stays on the device, where the next step's batch reads it.
    """

    token_ids: torch.Tensor  #: [B] int64
    logprobs: torch.Tensor | None = None  #: [B] float32, when any row asked for logprobs
    top: tuple[torch.Tensor, torch.Tensor] | None = None  #: values, ids [B, k]
    top_n: list[int] = field(default_factory=list)  #: each row's own ``top_logprobs``
    picked: torch.Tensor | None = None  #: [B, P] log-probabilities of each row's chosen ids
    picked_ids: list[list[int]] = field(default_factory=list)  #: each row's chosen ids
    errors: dict[int, Exception] = field(default_factory=dict)
    event: Any = None  #: the CUDA event after the host copy (set by ``to_host``)
    _host: list[torch.Tensor] | None = None

    def _tensors(self) -> list[torch.Tensor]:
        out = [self.token_ids]
        if self.logprobs is not None:
            out.append(self.logprobs)
        if self.top is not None:
            out += list(self.top)
        if self.picked is not None:
            out.append(self.picked)
        return out

    def to_host(self) -> "Drawn":
        """On a GPU, start the copy to host and record :attr:`event`; elsewhere nothing."""
        if self.token_ids.device.type != "cuda":
            return self
        self._host = [t.to("cpu", non_blocking=True) for t in self._tensors()]
        self.event = torch.cuda.Event()
        self.event.record()
        return self

    def result(self) -> SampleOutput:
        """The tokens as Python values (waits for the device when ``to_host`` was not called
        or its copy has not landed)."""
        if self.event is not None:
            self.event.synchronize()
        host = self._host or self._tensors()
        out = SampleOutput(token_ids=host[0].tolist(), errors=self.errors)
        if self.logprobs is not None:
            out.logprobs = host[1].tolist()
            out.top_logprobs = [[] for _ in out.token_ids]
            if self.top is not None:
                vals_l, idx_l = host[2].tolist(), host[3].tolist()
                for i, n in enumerate(self.top_n):
                    out.top_logprobs[i] = [(t, v) for t, v in zip(idx_l[i][:n], vals_l[i][:n])
                                           if v != -math.inf]
        if self.picked is not None:
            values = host[-1].tolist()
            out.ids_logprobs = [list(zip(ids, row)) for ids, row in zip(self.picked_ids, values)]
        return out


def kernel_enabled() -> bool:
    """Whether GPU draws go through the sampling kernel (``ENGINE_SAMPLE_KERNEL=0``: the
    torch ops, for comparisons)."""
    return os.environ.get("ENGINE_SAMPLE_KERNEL", "1") != "0"


def row_seed(row: SamplingRow) -> int:
    """The seed of a sampled row's draws as a signed 64-bit integer (its generator's seed; 0
    for a greedy row, which draws nothing)."""
    gen = row.generator
    if gen is None:
        return 0
    seed = gen.initial_seed()
    return seed - 2**64 if seed >= 2**63 else seed


def float_bits(values: list[float]) -> list[int]:
    """float32 bit patterns of ``values`` as Python ints (how float parameters travel in the
    integer vectors of :func:`~engine.runtime.batch.pack_to_device`)."""
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


def sample_lists(rows: Sequence[SamplingRow]) -> list[list[int]]:
    """The parameters of the sampling kernel (:mod:`engine.runtime.sample_triton`) for
    ``rows``: temperature, top_k, top_p, min_p (floats as bits), seed, and the position of the
    token being drawn (the row's output so far)."""
    params = [r.sampling_params for r in rows]
    return [float_bits([p.temperature for p in params]), [p.top_k for p in params],
            float_bits([p.top_p for p in params]), float_bits([p.min_p for p in params]),
            [row_seed(r) for r in rows], [len(r.output_ids) for r in rows]]


def sample_args(rows: Sequence[SamplingRow], device: torch.device) -> torch.Tensor:
    """:func:`sample_lists` as one [6, B] int64 tensor on ``device`` (one copy)."""
    flat = [v for part in sample_lists(rows) for v in part]
    return pack_to_device([flat], device)[0][0].view(6, len(rows))


class Sampler:
    """Batched sampler over ``[B, V]`` float32 logits (see the module docstring for the order).

    ``batch_invariant`` (``--enable-deterministic-inference``): each row is sampled alone, so
    its softmax, log-probabilities and draw never depend on the other rows.

    On a GPU the draws (greedy or not) are one kernel, :mod:`engine.runtime.sample_triton`,
    keyed by each row's seed and position; a decode step replayed from a CUDA graph ran that
    kernel inside the graph already (``drawn_ids``), which is used when no row's logits are
    changed before the draw. Elsewhere (``kernel`` False: the CPU) the torch ops below, with
    each row's generator. ``kernel=True`` forces the kernel (under the Triton interpreter).

    :meth:`draw` queues the work and returns a :class:`Drawn` without waiting for a GPU;
    calling the sampler draws and reads the result at once."""

    def __init__(self, batch_invariant: bool = False, kernel: bool | None = None) -> None:
        self.batch_invariant = batch_invariant
        self.kernel = kernel

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
                 drawn_ids: torch.Tensor | None = None) -> SampleOutput:
        if self.batch_invariant and len(rows) > 1:
            return _merge([self._sample(logits[i:i + 1].clone(), [row]).result()
                           for i, row in enumerate(rows)])
        return self._sample(logits, rows, drawn_ids).result()

    @torch.inference_mode()
    def draw(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
             drawn_ids: torch.Tensor | None = None) -> Drawn:
        """Sample without reading the tokens back (not with ``batch_invariant``);
        ``drawn_ids``: the tokens the sampling kernel drew from these logits inside a CUDA
        graph, if it did."""
        assert not (self.batch_invariant and len(rows) > 1), "batch-invariant draws are per row"
        return self._sample(logits, rows, drawn_ids)

    def _uses_kernel(self, logits: torch.Tensor) -> bool:
        if self.kernel is not None:
            return self.kernel
        return logits.device.type == "cuda" and kernel_enabled()

    def _sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
                drawn_ids: torch.Tensor | None = None) -> Drawn:
        """Sample one token per row. ``logits`` may be modified in place.

        Runs in inference mode: the model runner's logits are inference tensors, which may
        only be updated in place (penalties, ``min_new_tokens`` masks) inside it. A row whose
        penalties, mask or draw raises is recorded in ``errors``; what the batch as a whole
        computes (softmax, truncation, log-probabilities) raises to the caller. Nothing here
        waits for a GPU: a row whose probabilities are not finite or sum to zero is replaced
        on the device by a one-hot row at its logits' argmax.
        """
        assert logits.dim() == 2 and logits.shape[0] == len(rows), "one logits row per request"
        logits = logits.float()
        vocab, dev = logits.shape[1], logits.device
        errors: dict[int, Exception] = {}
        prepared = False  # whether any row's logits were penalised or masked
        for i, row in enumerate(rows):
            sp = row.sampling_params
            if sp.has_penalties or sp.min_new_tokens or sp.logit_bias:
                prepared = True
                try:
                    _prepare_row(logits[i], row, vocab)
                except Exception as exc:  # noqa: BLE001 - this row fails, the batch goes on
                    errors[i] = exc
        chosen = [i for i, r in enumerate(rows) if getattr(r, "logit_processor", None)
                  is not None and i not in errors]
        if chosen:
            from engine.runtime import logit_processors

            logit_processors.apply(logits, rows, chosen, errors)
        constrained = [i for i, r in enumerate(rows) if r.grammar is not None
                       and i not in errors]
        if constrained:
            _constrain(logits, rows, constrained, errors)

        want_lp = [r.sampling_params.logprobs or r.sampling_params.top_logprobs > 0
                   or bool(r.sampling_params.token_ids_logprob) for r in rows]
        logprobs = torch.log_softmax(logits, dim=-1) if any(want_lp) else None

        if self._uses_kernel(logits):
            if drawn_ids is not None and not (prepared or chosen or constrained):
                ids = drawn_ids  # (the logits it drew from are these, unchanged)
            else:
                from engine.runtime import sample_triton

                ids = sample_triton.sample(logits, *sample_args(rows, dev).unbind(0))
            return _with_logprobs(Drawn(token_ids=ids, errors=errors), logprobs, rows)
        greedy = [r.sampling_params.is_greedy for r in rows]
        sample_idx = [i for i, g in enumerate(greedy) if not g]
        drawn = None
        if sample_idx:
            sub = logits[to_device(sample_idx, dev)] if len(sample_idx) < len(rows) else logits
            probs = _truncated_probs(sub, [rows[i].sampling_params for i in sample_idx])
            fallback = _argmax(sub)
            total = probs.sum(dim=-1)
            bad = ~(total.isfinite() & (total > 0))  # a NaN or inf probability spoils the sum
            probs.masked_fill_(bad[:, None], 0.0)
            probs.scatter_add_(1, fallback[:, None], bad[:, None].to(probs.dtype))
            draws = []
            for j, i in enumerate(sample_idx):
                try:
                    draws.append(torch.multinomial(probs[j], 1, generator=rows[i].generator))
                except Exception as exc:  # noqa: BLE001 - this row fails, the batch goes on
                    errors[i] = exc
                    draws.append(fallback[j:j + 1])
            drawn = torch.cat(draws)
        if drawn is not None and len(sample_idx) == len(rows):
            ids = drawn
        else:
            ids = _argmax(logits)
            if drawn is not None:
                ids[to_device(sample_idx, dev)] = drawn

        return _with_logprobs(Drawn(token_ids=ids, errors=errors), logprobs, rows)


def _with_logprobs(out: Drawn, logprobs: torch.Tensor | None,
                   rows: Sequence[SamplingRow]) -> Drawn:
    """``out`` with the drawn tokens' log-probabilities and each row's top alternatives, when
    any row asked for them (``logprobs``: the batch's log-softmax, else None)."""
    if logprobs is not None:
        out.logprobs = logprobs.gather(1, out.token_ids[:, None]).squeeze(1)
        out.top_n = [r.sampling_params.top_logprobs for r in rows]
        k = max(out.top_n)
        if k > 0:
            vals, idx = logprobs.topk(k, dim=-1)
            out.top = (vals, idx)
        if any(r.sampling_params.token_ids_logprob for r in rows):
            out.picked_ids = [list(r.sampling_params.token_ids_logprob) for r in rows]
            out.picked = pick_logprobs(logprobs, out.picked_ids)
    return out


def pick_logprobs(logprobs: torch.Tensor, ids: list[list[int]]) -> torch.Tensor:
    """``logprobs`` [B, V] at each row's ``ids`` (rows padded to the longest: [B, P])."""
    width = max(map(len, ids))
    flat = [t for row in ids for t in row + [0] * (width - len(row))]
    return logprobs.gather(1, to_device(flat, logprobs.device).view(len(ids), width))


def _merge(outs: list[SampleOutput]) -> SampleOutput:
    """One output of single-row outputs (rows that asked for no log-probabilities get NaN and
    no alternatives when others did)."""
    merged = SampleOutput(token_ids=[o.token_ids[0] for o in outs])
    if any(o.logprobs is not None for o in outs):
        merged.logprobs = [o.logprobs[0] if o.logprobs is not None else math.nan for o in outs]
        merged.top_logprobs = [o.top_logprobs[0] if o.top_logprobs else [] for o in outs]
    if any(o.ids_logprobs is not None for o in outs):
        merged.ids_logprobs = [o.ids_logprobs[0] if o.ids_logprobs else [] for o in outs]
    merged.errors = {i: o.errors[0] for i, o in enumerate(outs) if o.errors}
    return merged


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of each row's first maximum, int64 on the logits' device, without waiting for a
    GPU; a NaN logit never wins (a row with no other value gives 0).

    On CPU through NumPy, whose row argmax over a vocabulary is several times faster than
    torch's; both return the first maximal index, or that of the first NaN, which is then
    masked. On a GPU the NaNs become ``-inf`` in place first.
    """
    if logits.device.type == "cpu":
        arr = logits.numpy()
        ids = arr.argmax(axis=-1)
        if np.isnan(arr[np.arange(len(ids)), ids]).any():
            ids = np.where(np.isnan(arr), -np.inf, arr).argmax(axis=-1)
        return torch.from_numpy(ids.astype(np.int64, copy=False))
    torch.nan_to_num_(logits, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    return logits.argmax(dim=-1)


def _constrain(logits: torch.Tensor, rows: Sequence[SamplingRow], idx: list[int],
               errors: dict[int, Exception]) -> None:
    """Mask rows ``idx`` of ``logits`` in place to the tokens their grammars allow; a row whose
    matcher raises, or allows no token, is recorded in ``errors``.

    A row whose mask was computed ahead (a :class:`~engine.runtime.grammar.PendingMask` in its
    ``grammar_mask``, consumed here) waits for it; the others fill theirs now."""
    words = (logits.shape[1] + 31) // 32
    bitmask = None
    for k, i in enumerate(idx):
        row = rows[i]
        try:
            pending = getattr(row, "grammar_mask", None)
            if pending is not None:
                row.grammar_mask = None
                mask = pending.result()
            if pending is None or mask.shape[-1] != words:
                if bitmask is None:
                    bitmask = allocate_token_bitmask(len(idx), logits.shape[1])
                row.grammar.fill_bitmask(bitmask, k)
                mask = bitmask[k]
            if not mask.any():
                raise GrammarDeadEnd(f"the grammar allows no next token after "
                                     f"{len(row.output_ids)} generated tokens (a dead end "
                                     "of the constraint)")
            apply_token_bitmask_inplace(logits[i], mask)
        except Exception as exc:  # noqa: BLE001 - this row fails, the batch goes on
            errors[i] = exc


def _prepare_row(logits: torch.Tensor, row: SamplingRow, vocab: int) -> None:
    """Apply one row's logit bias, penalties and ``min_new_tokens`` mask, in place."""
    sp = row.sampling_params
    if sp.logit_bias:
        ids, vals, last = sp.bias_tensors(logits.device)
        if last >= vocab:  # (checked against the tokenizer's vocabulary on arrival)
            raise InvalidParam("logit_bias", f"logit_bias lists token {last}, beyond the "
                               f"model's {vocab} logits")
        logits.index_add_(0, ids, vals)
    if sp.has_penalties:
        _apply_penalties(logits, row, vocab)
    if sp.min_new_tokens and len(row.output_ids) < sp.min_new_tokens and row.stop_ids:
        logits[[t for t in row.stop_ids if t < vocab]] = float("-inf")


def _apply_penalties(logits: torch.Tensor, row: SamplingRow, vocab: int) -> None:
    """Penalise one row in place (repetition over prompt + output, the others over output)."""
    sp = row.sampling_params
    out_ids = torch.tensor(row.output_ids, dtype=torch.long, device=logits.device)
    if sp.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
        if row.origin_input_ids:
            prompt = torch.tensor(row.origin_input_ids, dtype=torch.long, device=logits.device)
            seen[prompt.clamp_(0, vocab - 1)] = True
        if out_ids.numel():
            seen[out_ids] = True
        penalised = torch.where(logits > 0, logits / sp.repetition_penalty,
                                logits * sp.repetition_penalty)
        logits.copy_(torch.where(seen, penalised, logits))
    if out_ids.numel() and (sp.frequency_penalty or sp.presence_penalty):
        counts = torch.bincount(out_ids, minlength=vocab)[:vocab].to(logits.dtype)
        logits -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0).to(
            logits.dtype)


def _truncated_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p truncation; returns probabilities [b, V].

    Whether a row goes through the truncation path depends on its own parameters only, so its
    probabilities (and hence its seeded draws) do not depend on the other rows.
    """
    dev = logits.device
    temps = to_device([p.temperature for p in params], dev, logits.dtype)
    logits = logits / temps[:, None]
    vocab = logits.shape[1]
    probs = torch.softmax(logits, dim=-1)
    trunc = [i for i, p in enumerate(params)
             if 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0]
    if len(trunc) == len(params):
        probs = _truncate(logits, params)
    elif trunc:
        rows = to_device(trunc, dev)
        probs[rows] = _truncate(logits[rows], [params[i] for i in trunc])
    return probs


def _truncate(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    dev, vocab = logits.device, logits.shape[1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=dev)[None, :]
    ks = to_device(top_k, dev)[:, None]
    sorted_logits.masked_fill_(ranks >= ks, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    top_p = to_device([p.top_p for p in params], dev, probs.dtype)[:, None]
    # drop a token when the tokens before it already reach top_p (the best one always stays)
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    min_p = to_device([p.min_p for p in params], dev, probs.dtype)[:, None]
    drop |= probs < min_p * probs[:, :1]
    drop[:, 0] = False
    probs = probs.masked_fill(drop, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, order, probs)
