"""One generation request as the scheduler tracks it, and the deltas it reports.

A :class:`Req` is one sequence (a request with ``n > 1`` is ``n`` of them). Its tokens are
``fill_ids = origin_input_ids + output_ids``; ``kv_len`` of them have K/V in the pool, at
``req_to_token[row, :kv_len]``. The first ``prefix_len`` of those slots belong to the radix
cache (locked through ``prefix_node``); the rest belong to the request until it is released.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from engine.runtime.sampling import SamplingParams

log = logging.getLogger("engine.scheduler")


@dataclass
class ReqOutput:
    """What one scheduler step adds to one request (a stream delta; the last has ``finished``).

    ``finish_reason`` is ``{"type": "stop"|"length"|"abort", "matched": <id or str>,
    "message": <str>}`` (``matched``/``message`` only where they apply).
    """

    rid: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    #: per token: the request's ``token_ids_logprob`` as (id, log-probability) pairs
    ids_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finished: bool = False
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    #: the prompt's embedding (``--is-embedding``), on its one and last output
    embedding: list[float] | None = None
    #: of ``cached_tokens``, how many each tier supplied: ``{"device", "host", "storage"}``
    cached_tokens_details: dict[str, int] | None = None
    #: speculative decoding: verify forwards of this request so far, draft tokens accepted
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    #: on the last output: the scheduler's times of the request (``time.monotonic()``):
    #: ``arrival``, ``scheduled`` (first admitted), ``first_token`` (on the host)
    time_stats: dict[str, float | None] | None = None
    #: on the first output of a request that asked for them: the prompt tokens from its
    #: ``logprob_start_len`` on, their log-probabilities (None for token 0) and alternatives
    input_token_ids: list[int] | None = None
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[int, float]]] | None = None
    input_ids_logprobs: list[list[tuple[int, float]]] | None = None


def merge_outputs(first: ReqOutput, then: ReqOutput) -> ReqOutput:
    """Two consecutive outputs of one sequence as one (the later one's state and counts)."""
    prompt = first if first.input_logprobs is not None else then
    return dataclasses.replace(
        then, text=first.text + then.text, token_ids=first.token_ids + then.token_ids,
        logprobs=first.logprobs + then.logprobs,
        top_logprobs=first.top_logprobs + then.top_logprobs,
        ids_logprobs=first.ids_logprobs + then.ids_logprobs,
        input_token_ids=prompt.input_token_ids, input_logprobs=prompt.input_logprobs,
        input_top_logprobs=prompt.input_top_logprobs,
        input_ids_logprobs=prompt.input_ids_logprobs)


Sink = Callable[[ReqOutput], None]


class Channel(Protocol):
    """Carries outputs to consumers elsewhere (another thread's event loop): one ``deliver``
    call per scheduler step for all of that step's outputs on the channel, in order."""

    def deliver(self, items: list[tuple["ChannelSink", ReqOutput]]) -> None: ...


@dataclass(eq=False)
class ChannelSink:
    """A sink that reaches its consumer through a shared :class:`Channel`.

    ``receive`` runs on the consumer's side (after the channel's hand-off). Called on its own,
    the sink delivers one output; :func:`emit` groups a step's outputs per channel instead.
    """

    channel: Channel
    receive: Callable[[ReqOutput], None]

    def __call__(self, out: ReqOutput) -> None:
        self.channel.deliver([(self, out)])


def emit(items: Sequence[tuple[Sink, ReqOutput]]) -> list[int]:
    """Hand each output to its sink, in order. The outputs for channel sinks
    (:class:`ChannelSink`) of one channel go in a single ``deliver`` call, made after the plain
    sinks have been called.

    A sink (or channel) that raises does not keep the others from their outputs: the error is
    logged and the positions in ``items`` whose delivery raised are returned (every position
    of a channel whose ``deliver`` raised).
    """
    failed: list[int] = []
    groups: dict[int, tuple[Channel, list[int]]] = {}
    for k, (sink, out) in enumerate(items):
        if isinstance(sink, ChannelSink):
            groups.setdefault(id(sink.channel), (sink.channel, []))[1].append(k)
            continue
        try:
            sink(out)
        except Exception:  # noqa: BLE001 - reported to the caller
            log.exception("delivering the output of request %s failed", out.rid)
            failed.append(k)
    for channel, positions in groups.values():
        try:
            channel.deliver([items[k] for k in positions])  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - reported to the caller
            log.exception("delivering outputs to a channel failed")
            failed.extend(positions)
    return sorted(failed)


class Detokenizer:
    """What the scheduler needs from the model side's incremental detokenizer."""

    def add(self, token_id: int) -> str: ...  # pragma: no cover - interface

    def finish(self) -> str: ...  # pragma: no cover - interface


@dataclass(eq=False)
class Req:
    """Scheduler-side state of one sequence. Mutated only by the scheduler thread."""

    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    sink: Sink
    detokenizer: Detokenizer
    #: ids that end the sequence: eos (unless ``ignore_eos``) and ``stop_token_ids``
    stop_ids: frozenset[int] = frozenset()
    generator: torch.Generator | None = None
    max_new_tokens: int = 0  #: resolved against the context length by the front end
    priority: int = 0  #: higher runs first under priority scheduling
    routing_key: str | None = None  #: requests with one key are admitted together (routing-key)
    #: the constraint's matcher (:class:`engine.api.grammar.GrammarMatcher`), or None
    grammar: Any = None
    #: the chosen :class:`engine.runtime.logit_processors.ChosenProcessor`, or None
    logit_processor: Any = None
    #: its next-token mask being computed ahead (:class:`engine.runtime.grammar.PendingMask`)
    grammar_mask: Any = None
    output_ids: list[int] = field(default_factory=list)
    #: trailing entries of ``output_ids`` sampled by a step still on the device (the overlap
    #: scheduler's placeholders, -1 until read back); the newest is row ``future_row`` of
    #: that step's tokens
    unresolved: int = 0
    future_row: int = 0
    # KV state
    row: int | None = None
    kv_len: int = 0
    last_slot: int | None = None  #: slot of token ``kv_len - 1`` once allocated
    prefix_len: int = 0
    prefix_node: Any = None
    cached_tokens: int = 0
    cached_tiers: dict[str, int] | None = None  #: cached tokens per tier (device, host, storage)
    prefetch: Any = None  #: the storage read started when it arrived (hierarchical cache)
    storage_retries: int = 0  #: storage reads issued again while it waited (see the scheduler)
    storage_wait: int = 0  #: scheduling passes since its last storage read was looked at
    # text state
    text: str = ""
    sent_len: int = 0
    finish_reason: dict[str, Any] | None = None
    arrival: float = field(default_factory=time.monotonic)
    scheduled_time: float | None = None  #: first admitted into a batch
    first_token_time: float | None = None  #: its first token known on the host
    num_retractions: int = 0
    spec_verify_ct: int = 0  #: speculative verify forwards it took part in
    spec_accepted_tokens: int = 0  #: draft tokens of it the target accepted
    #: its prompt's log-probabilities recorded so far (``logprob_start_len`` >= 0:
    #: :mod:`engine.runtime.prompt_logprobs`), their alternatives, and whether they went out
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_ids_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs_sent: bool = False

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def known_len(self) -> int:
        """Tokens whose ids are known on the host (``seq_len`` less the unresolved ones)."""
        return self.seq_len - self.unresolved

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
