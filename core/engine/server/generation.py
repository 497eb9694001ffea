"""The bridge between the event loop and the scheduler thread, for one HTTP request.

Each request's sink is a :class:`~engine.runtime.request.ChannelSink` on the loop's
:class:`LoopChannel`: the scheduler hands all outputs of one step to the event loop with a
single ``call_soon_threadsafe`` (the loop never blocks on the model, and wakes once per step,
not once per token). A :class:`Generation` submits every sequence of one HTTP request (prompts
x ``n``), yields their outputs as they come (every ``--stream-interval`` tokens), records
metrics, logs finished requests (``--log-requests``), and aborts what is left when the client
goes away or the server shuts down. Its ``rid`` (the client's, or a fresh one) is unique among
the requests in flight (:meth:`~engine.runtime.frontend.Runtime.claim_rid`) until its last
sequence finishes; aborts name its own sequences, so they never reach another request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from starlette.requests import Request

from engine.api.grammar import GrammarSpec, InvalidGrammar
from engine.config import ServerConfig
from engine.runtime.frontend import RequestError
from engine.runtime.grammar import GrammarUnavailable
from engine.runtime.request import ChannelSink, Req, ReqOutput, merge_outputs
from engine.runtime.sampling import SamplingParams
from engine.runtime.scheduler import QueueFull
from engine.server.state import ServerState

DISCONNECT_POLL_S = 0.5
LOG_TEXT_CHARS = 2048  #: characters of input and output logged at --log-requests-level 2

request_log = logging.getLogger("engine.requests")


class ClientGone(Exception):
    """The client disconnected; its sequences were aborted. The argument is the request id."""


def shutting_down() -> RequestError:
    """The error of a request that the server's shutdown ended, or refused."""
    return RequestError("the server is shutting down; retry the request", status=503,
                        type="server_unavailable", code="shutting_down")


class LoopChannel:
    """Hands outputs from the scheduler thread to one event loop: one callback per delivery."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def deliver(self, items: list[tuple[ChannelSink, ReqOutput]]) -> None:
        """Thread-safe: run each sink's ``receive`` on the loop, in order."""
        self.loop.call_soon_threadsafe(_receive_all, items)


def _receive_all(items: list[tuple[ChannelSink, ReqOutput]]) -> None:
    for sink, out in items:
        sink.receive(out)


_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopChannel] = \
    weakref.WeakKeyDictionary()


def loop_channel(loop: asyncio.AbstractEventLoop) -> LoopChannel:
    """The one :class:`LoopChannel` of ``loop`` (call on the loop's own thread)."""
    channel = _channels.get(loop)
    if channel is None:
        channel = _channels[loop] = LoopChannel(loop)
    return channel


_GONE = object()  #: put in a generation's queue by its watchdog when the client disconnected
_CLOSED = object()  #: put in a generation's queue by :meth:`Generation.close`


@dataclass
class SeqState:
    """Accumulated output of one sequence (one choice)."""

    index: int
    prompt_index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    ids_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_details: dict[str, int] | None = None
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    embedding: list[float] | None = None  #: the prompt's embedding (``--is-embedding``)
    #: the prompt's tokens from ``logprob_start_len`` on, their log-probabilities (None for
    #: token 0) and alternatives, where the request asked for them
    input_token_ids: list[int] | None = None
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[int, float]]] | None = None
    input_ids_logprobs: list[list[tuple[int, float]]] | None = None


def check_limits(config: ServerConfig, params: list[SamplingParams], prompt_param: str) -> None:
    """Hold one request (``params``: one per prompt) to the server's limits on its work:
    sequences (prompts x ``n``), stop strings and their length. Raises :class:`RequestError`
    naming the field (``n``, ``stop``, or ``prompt_param`` for a batch) and the flag."""
    seqs = sum(sp.n for sp in params)
    if seqs > config.max_sequences_per_request:
        what = f"n={params[0].n}" if len(params) == 1 else f"{len(params)} prompts"
        raise RequestError(f"this request asks for {seqs} sequences ({what}); this server "
                           f"generates at most {config.max_sequences_per_request} per request "
                           "(--max-sequences-per-request)",
                           param="n" if len(params) == 1 else prompt_param)
    for sp in params:
        if len(sp.stop) > config.max_stop_strings:
            raise RequestError(f"{len(sp.stop)} stop strings; this server takes at most "
                               f"{config.max_stop_strings} (--max-stop-strings)", param="stop")
        longest = max(map(len, sp.stop), default=0)
        if longest > config.max_stop_length:
            raise RequestError(f"a stop string of {longest} characters; this server takes at "
                               f"most {config.max_stop_length} (--max-stop-length)",
                               param="stop")


async def grammar_matchers(state: ServerState,
                           constraints: list[tuple[GrammarSpec, str] | None],
                           params: list[SamplingParams]) -> list[list[Any] | None] | None:
    """Per prompt, ``params[i].n`` matchers of its constraint (``constraints[i]``: the spec and
    the field that gave it, from :func:`engine.server.protocol.constraint`, or None), compiled
    off the event loop and the scheduler thread; None when no prompt is constrained. An
    invalid spec is a :class:`RequestError` (400) with the backend's message."""
    if not any(constraints):
        return None
    grammars = state.runtime.grammars
    out: list[list[Any] | None] = []
    for found, sp in zip(constraints, params):
        if found is None:
            out.append(None)
            continue
        spec, param = found
        if grammars is None:
            raise RequestError("constrained decoding needs a grammar backend and the model's "
                               "tokenizer; this server has none (no grammar plugin is "
                               "installed, or it runs with --skip-tokenizer-init)", param=param)
        try:
            out.append(await grammars.matchers(spec, sp.n))
        except InvalidGrammar as exc:
            raise RequestError(str(exc), param=param, code="invalid_grammar") from None
        except GrammarUnavailable as exc:
            raise RequestError(f"constrained decoding is unavailable: {exc}", param=param,
                               status=503, type="server_error") from None
    return out


class Generation:
    """Submit ``prompts`` (token ids, one params each) as one unit; iterate over outputs.

    Raises :class:`RequestError`: beyond the server's limits (:func:`check_limits`), a prompt
    or params the runtime refuses, a full queue (503) or a server shutting down (503).
    ``priority`` and ``routing_key`` reach the scheduler's policies; ``logit_processors``
    (one per prompt, or None) the sampler.
    """

    def __init__(self, state: ServerState, prompts: list[list[int]],
                 params: list[SamplingParams], request: Request | None, *,
                 rid: str | None = None, prompt_param: str = "prompt",
                 max_tokens_param: str = "max_tokens", priority: int | None = None,
                 routing_key: str | None = None,
                 grammars: list[list[Any] | None] | None = None,
                 logit_processors: list[Any] | None = None) -> None:
        runtime = self.runtime = state.runtime
        self.config, self.prompts, self.params = state.config, prompts, params
        self.metrics, self.request, self.drain = state.metrics, request, state.drain
        if self.drain.closed:
            raise shutting_down()
        check_limits(state.config, params, prompt_param)
        self.rid = runtime.claim_rid(rid)
        self.start = time.monotonic()
        self._queue: asyncio.Queue[ReqOutput | object] = asyncio.Queue()
        sink = ChannelSink(loop_channel(asyncio.get_running_loop()), self._receive)

        self.reqs: list[Req] = []
        self.seqs: dict[str, SeqState] = {}
        try:
            for p_i, (ids, sp) in enumerate(zip(prompts, params)):
                sub = self.rid if len(prompts) == 1 else f"{self.rid}-p{p_i}"
                for req in runtime.make_reqs(sub, ids, sp, sink, param=prompt_param,
                                             max_tokens_param=max_tokens_param,
                                             priority=priority, routing_key=routing_key,
                                             grammars=grammars[p_i] if grammars else None,
                                             logit_processor=logit_processors[p_i]
                                             if logit_processors else None):
                    self.seqs[req.rid] = SeqState(index=len(self.reqs), prompt_index=p_i)
                    self.reqs.append(req)
            runtime.scheduler.submit(self.reqs)
        except QueueFull as exc:
            runtime.release_rid(self.rid)
            raise RequestError(str(exc), status=503, code="queue_full",
                               type="server_overloaded") from None
        except BaseException:
            runtime.release_rid(self.rid)
            raise
        self._open = self._live = len(self.reqs)
        self.drain.generations.add(self)

    def _receive(self, out: ReqOutput) -> None:
        """The sink's receiving end (on the loop): queue ``out``; give the rid back once the
        scheduler has finished every sequence (whether or not anyone still iterates)."""
        self._queue.put_nowait(out)
        if out.finished:
            self._live -= 1
            if self._live == 0:
                self.runtime.release_rid(self.rid)

    @property
    def states(self) -> list[SeqState]:
        return sorted(self.seqs.values(), key=lambda s: s.index)

    async def __aiter__(self) -> AsyncIterator[tuple[SeqState, ReqOutput]]:
        """Yield ``(state after the output, output)`` until every sequence has finished; a
        sequence's outputs are merged until they hold ``--stream-interval`` tokens (or it
        finishes).

        Raises :class:`ClientGone` when the client disconnects (checked every
        ``DISCONNECT_POLL_S`` by a watchdog task while the generation runs), and the 503
        :class:`RequestError` of :func:`shutting_down` after :meth:`close`.
        """
        watchdog = None
        if self.request is not None and self._open:
            watchdog = asyncio.ensure_future(self._watch(self.request))
        interval = max(1, self.config.stream_interval)
        pending: dict[str, ReqOutput] = {}
        try:
            while self._open:
                out = await self._queue.get()
                if out is _GONE:
                    raise ClientGone(self.rid)
                if out is _CLOSED:
                    raise shutting_down()
                assert isinstance(out, ReqOutput)
                state = self._apply(out)
                if out.rid in pending:
                    out = merge_outputs(pending.pop(out.rid), out)
                if not out.finished and len(out.token_ids) < interval:
                    pending[out.rid] = out
                    continue
                yield state, out
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if self._open:  # the client left (or the handler failed): stop the rest
                self.runtime.scheduler.abort(self.reqs)
                left = sum(1 for s in self.seqs.values() if s.finish_reason is None)
                self.metrics.requests.labels(self.metrics.model_name, "abort").inc(left)
                self._open = 0
            self.drain.generations.discard(self)

    def close(self) -> None:
        """End the iteration with the error of :func:`shutting_down` (the server's shutdown);
        the sequences still running are aborted."""
        self._queue.put_nowait(_CLOSED)

    async def _watch(self, request: Request) -> None:
        """Wake the iteration with ``_GONE`` once the client has disconnected (stop watching,
        quietly, if the connection can no longer tell)."""
        while True:
            await asyncio.sleep(DISCONNECT_POLL_S)
            try:
                gone = await request.is_disconnected()
            except Exception:  # noqa: BLE001 - the response is over or the transport is gone
                return
            if gone:
                self._queue.put_nowait(_GONE)
                return

    async def collect(self) -> list[SeqState]:
        async for _ in self:
            pass
        return self.states

    def _apply(self, out: ReqOutput) -> SeqState:
        s = self.seqs[out.rid]
        now = time.monotonic()
        m, name = self.metrics, self.metrics.model_name
        if out.token_ids:
            if s.first_token_at is None:
                s.first_token_at = now
                m.observe_ttft(now - self.start)
            elif s.last_token_at is not None:
                m.observe_itl((now - s.last_token_at) / len(out.token_ids))
            s.last_token_at = now
        s.text += out.text
        s.token_ids.extend(out.token_ids)
        s.logprobs.extend(out.logprobs)
        s.top_logprobs.extend(out.top_logprobs)
        s.ids_logprobs.extend(out.ids_logprobs)
        if out.input_logprobs is not None:
            s.input_token_ids = out.input_token_ids
            s.input_logprobs = out.input_logprobs
            s.input_top_logprobs = out.input_top_logprobs
            s.input_ids_logprobs = out.input_ids_logprobs
        if out.embedding is not None:
            s.embedding = out.embedding
        if out.finished:
            self._open -= 1
            s.finish_reason = out.finish_reason
            s.prompt_tokens, s.completion_tokens = out.prompt_tokens, out.completion_tokens
            s.cached_tokens = out.cached_tokens
            s.cached_tokens_details = out.cached_tokens_details
            s.spec_verify_ct, s.spec_accepted_tokens = (out.spec_verify_ct,
                                                        out.spec_accepted_tokens)
            reason = (out.finish_reason or {}).get("type", "unknown")
            m.requests.labels(name, reason).inc()
            m.prompt_tokens.labels(name).inc(out.prompt_tokens)
            m.generation_tokens.labels(name).inc(out.completion_tokens)
            m.cached_tokens.labels(name).inc(out.cached_tokens)
            for tier, n in (out.cached_tokens_details or {}).items():
                if n:
                    m.cached_tokens_tier.labels(name, tier).inc(n)
            m.e2e.labels(name).observe(now - self.start)
            if self.config.log_requests:
                self._log_finished(out.rid, s, now - self.start)
            if self.config.enable_request_time_stats_logging and out.time_stats:
                self._log_times(out, s, now)
        return s

    def _log_times(self, out: ReqOutput, s: SeqState, now: float) -> None:
        """``--enable-request-time-stats-logging``: one line for a finished sequence, times
        in ms from the HTTP side's start of the request (:func:`time_stats_record`)."""
        self._log_record("request time stats",
                         time_stats_record(out, self.start, s.first_token_at, now))

    def _log_finished(self, rid: str, s: SeqState, seconds: float) -> None:
        """One log line for a finished sequence, as ``--log-requests-level`` and
        ``--log-requests-format`` say."""
        level = self.config.log_requests_level
        record: dict[str, Any] = {
            "rid": rid, "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "cached_tokens": s.cached_tokens, "finish_reason": (s.finish_reason or {}).get("type"),
            "e2e_latency": round(seconds, 4)}
        if level >= 1:
            record["sampling_params"] = dataclasses.asdict(self.params[s.prompt_index])
        if level >= 2:
            limit = LOG_TEXT_CHARS if level == 2 else None
            tok = self.runtime.tokenizer
            prompt = self.prompts[s.prompt_index]
            record["input"] = tok.decode(prompt)[:limit] if tok is not None else prompt[:limit]
            record["output"] = s.text[:limit]
        self._log_record("finished request", record)

    def _log_record(self, what: str, record: dict[str, Any]) -> None:
        """``record`` as one request log line: a JSON object (``--log-requests-format json``),
        else ``what`` and its ``key=value`` pairs."""
        if self.config.log_requests_format == "json":
            request_log.info(json.dumps(record, ensure_ascii=False))
        else:
            request_log.info("%s %s", what, " ".join(
                f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in record.items()))


def time_stats_record(out: ReqOutput, start: float, first_token_at: float | None,
                      now: float) -> dict[str, Any]:
    """Where a finished sequence's time went, in ms: ``queue`` (the request's arrival at the
    scheduler to its admission into a batch), ``prefill`` (admission to its first token on the
    scheduler's host: batch building, the forwards, sampling, the read-back), ``handover``
    (that token to the HTTP side), ``ttft`` (the HTTP side's start of the request to its first
    token there), ``decode`` (its first token to its last) and ``e2e``, with the token counts
    and the cached tokens per tier. A time the sequence never reached is null."""
    t = out.time_stats or {}

    def us(a: float) -> int:  # every stamp rounded once, so the phases add up exactly
        return round((a - start) * 1e6)

    def ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (us(b) - us(a)) / 1e3

    return {"rid": out.rid, "prompt_tokens": out.prompt_tokens,
            "cached_tokens": out.cached_tokens,
            "cached_tokens_details": out.cached_tokens_details or {},
            "completion_tokens": out.completion_tokens,
            "queue": ms(t.get("arrival"), t.get("scheduled")),
            "prefill": ms(t.get("scheduled"), t.get("first_token")),
            "handover": ms(t.get("first_token"), first_token_at),
            "ttft": ms(start, first_token_at), "decode": ms(first_token_at, now),
            "e2e": ms(start, now)}


def internal_failure(states: list[SeqState]) -> str | None:
    """The message of a sequence that the scheduler failed (not a client abort), if any."""
    for s in states:
        reason = s.finish_reason or {}
        if reason.get("type") == "abort" and reason.get("message") != "request aborted":
            return str(reason.get("message"))
    return None


def usage(states: list[SeqState], *, cache_report: bool = False) -> dict[str, Any]:
    """OpenAI ``usage``: prompt tokens counted once per prompt, completions per sequence;
    ``prompt_tokens_details.cached_tokens`` with ``cache_report`` (``--enable-cache-report``)."""
    prompts: dict[int, SeqState] = {}
    for s in states:
        prompts.setdefault(s.prompt_index, s)
    prompt = sum(s.prompt_tokens for s in prompts.values())
    cached = sum(s.cached_tokens for s in prompts.values())
    completion = sum(s.completion_tokens for s in states)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if cache_report:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out
