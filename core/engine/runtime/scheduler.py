"""Continuous batching: which requests run in the next forward, and what their results mean.

Each :meth:`Scheduler.step` takes new requests and aborts from a thread-safe inbox, picks one
batch, runs the model runner on it, samples, and reports a :class:`ReqOutput` to each request's
sink. Requests join and leave between steps.

* **Prefill** (an ``EXTEND`` batch): the partly prefilled request first, then waiting requests
  in policy order (:mod:`engine.runtime.schedule_policy`), each starting after
  its radix-cache hit, until ``chunked_prefill_size`` new tokens are packed; a prompt longer
  than what is left is cut into chunks across steps. When decode requests are running, a
  prefill of at most ``MIXED_PREFILL_TOKENS`` new tokens runs in the same forward as their next
  tokens (a *mixed* step: requests arriving one by one cost no decode step); a larger one
  alternates with decode steps, so a long prompt never stalls the running streams. With
  ``--enable-mixed-chunk`` every prefill chunk mixes, unless the prefill attention backend
  pads extend rows (``AttentionBackend.pads_extend``).
* **Decode**: one token for every running request; with speculative decoding
  (``speculative``: a :class:`engine.runtime.speculative.SpecDecoder`), a verify step of
  each request's drafts instead whenever any request has one (several tokens per request).
* **Storage reads issued again** (``--hicache-storage-prefetch-retry-poll-interval`` N > 0):
  a queued request whose storage read found none of its pages stays queued for N prefill
  scheduling passes, then reads again (another server's backup may have landed meanwhile),
  at most ``--hicache-storage-prefetch-retry-max-attempts`` times. While the prefetch
  policy would wait for a read (``wait_complete``, ``timeout``: within its budget) the request
  stays queued until the read answers (the N passes count from the answer); under
  ``best_effort`` a read issued again gets N passes to complete before the request is admitted
  with what the faster tiers hold.
* **Memory**: pages come from the allocator; when short, unlocked radix-cache leaves are
  evicted (``--radix-eviction-policy``; with the hierarchical cache they move to the host
  tier first, :mod:`engine.runtime.hiradix_cache`); when still short, a new request waits in the queue, and a decode step retracts
  running requests (``--retraction-policy``; by default the most recently admitted; their KV goes back to the cache and they are re-queued
  to continue later from prompt + output so far). A lone request that cannot grow ends with
  ``length``. Nothing here raises on memory pressure.
* **Overlap** (on a GPU, unless ``--disable-overlap-schedule``): a step's tokens are drawn on
  the device and read back only after the next step has been launched, so the host builds
  step N+1, and finishes and emits step N, while the GPU runs step N+1. A request whose last
  token is still on the device has a placeholder in ``output_ids`` (``Req.unresolved``); the
  next batch takes that token from the device (:meth:`_batch`). A request that turns out to
  have finished at step N wasted its row in step N+1 (whose token is dropped); one that must
  finish (``max_new_tokens``, the context) is not scheduled again. A step with a request
  whose sampling reads its generated tokens (penalties, a grammar, a logit processor) reads
  its tokens back at once, and retraction and aborts first read back the step in flight.
* **Constrained requests**: after a step's tokens are appended (each accepted by its
  request's grammar matcher), :class:`~engine.runtime.grammar.MaskPrefetcher` computes their
  next masks in a worker thread while this thread emits, schedules and runs the next forward;
  the sampler joins each mask just before it samples (``ENGINE_GRAMMAR_OVERLAP=0``: inline).
* **Finishing**: eos (unless ``ignore_eos``) and ``stop_token_ids`` (the id is counted, its text
  not emitted), stop strings (cut from the text, also when split across tokens: text that could
  still begin a stop string is held back), a constrained request's grammar reaching its end
  (``stop``; its matcher accepts every token as it is appended), ``max_new_tokens`` and the
  context length. A grammar that allows no next token ends its request with ``abort`` and
  says so.
* **Aborts** name the :class:`Req` objects to end (a client's ``n`` sequences are the list it
  submitted), never a request id: a client cannot end another client's request.

Failure isolation (:meth:`step` never raises):

* An exception in the work of one request - admitting it or taking its KV slots, preparing its
  sampling row (penalties, masks) or drawing its token, appending/detokenizing/matching stops,
  handing its output to its sink - fails that request alone: its last output carries
  ``finish_reason = {"type": "abort", "message": "internal error while ..."}`` (the HTTP layer
  answers it as an error), its KV is freed, and the step goes on for the others.
* An exception that belongs to no one request (the forward itself, a batched sampling op, an
  observer) fails the requests of that step - those in the forward and those admitted in it -
  once, frees their KV, and leaves the others (queued, or running outside that forward) to go
  on in the next step.
* Only when that clean-up raises as well, or the failure came before the step took any
  request, is the KV bookkeeping itself suspect: every request holding KV fails and memory
  starts over (the waiting queue, which holds none, is kept).

The scheduler runs in one thread (:meth:`start`, or :meth:`run` in a thread of the caller's: the
one that loaded the model, see :func:`engine.runtime.frontend.start_runtime`) or is stepped by
its caller (offline engine). ``--show-time-cost`` (or ``ENGINE_STEP_TIMING=N``) logs where its
steps' time goes.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.config import ServerConfig
from engine.runtime import cpu_threads, prompt_logprobs
from engine.runtime.allocator import PageAllocator, ReqToTokenRows
from engine.runtime.batch import Batch, ForwardMode, pack_to_device, to_device
from engine.runtime.grammar import MaskPrefetcher
from engine.runtime.kv_cache import build_cache
from engine.runtime.req_output import (error_output, failure, fill_counts, finish, new_text,
                                       next_output, sample_failure)
from engine.runtime.request import Req, ReqOutput, Sink, emit
from engine.runtime.sampling import (Drawn, SampleOutput, Sampler, kernel_enabled,
                                     sample_lists)
from engine.runtime.schedule_policy import order, retraction_victim
from engine.runtime.step_timer import step_timer

log = logging.getLogger("engine.scheduler")

DEFAULT_CHUNKED_PREFILL = {"cpu": 2048, "cuda": 8192}
#: tokens of decode room a new request must find free to be admitted (times
#: ``--schedule-conservativeness``)
ADMIT_DECODE_RESERVE = 64
#: a prefill of at most this many new tokens shares its forward with the running requests'
#: decode tokens (their rows are padded to the longest extend by some attention backends, so
#: this stays small)
MIXED_PREFILL_TOKENS = 128
RETRY_PASS_S = 0.001  #: pause of a pass in which only storage reads were waited for


@dataclass
class InFlight:
    """A step whose sampled tokens are still on the device (the overlap scheduler's)."""

    reqs: list[Req]  #: the sampled requests, in row order
    drawn: Drawn
    batch: Batch
    vocab: int


class QueueFull(RuntimeError):
    """More waiting requests than ``--max-queued-requests`` allows (HTTP 503)."""


@dataclass
class SchedulerStats:
    """A snapshot for /metrics and /get_server_info."""

    num_running: int
    num_waiting: int
    kv_used_tokens: int
    kv_cached_tokens: int
    kv_capacity_tokens: int
    num_retractions: int
    num_steps: int
    #: speculative decoding's counters (:class:`engine.runtime.speculative.SpecStats`), or None
    spec: Any = None

    @property
    def kv_usage(self) -> float:
        return self.kv_used_tokens / max(1, self.kv_capacity_tokens)


class Scheduler:
    """Owns the KV bookkeeping and the request queues of one model runner."""

    def __init__(self, config: ServerConfig, runner: Any, *, eviction: Any = None,
                 storage_factory: Callable[[Any], Any] | None = None,
                 speculative: Any = None) -> None:
        """``eviction``: the ``--radix-eviction-policy`` object (None: least recently used);
        ``storage_factory(storage_config)``: builds the hierarchical cache's store;
        ``speculative``: the ``--speculative-algorithm`` product (None: off)."""
        self.config, self.runner = config, runner
        self.spec = speculative  #: the verify step (None: plain decoding)
        self.device = runner.device
        self.page_size = runner.pool.page_size
        self.allocator = PageAllocator(runner.pool.num_slots, self.page_size)
        self.rows = ReqToTokenRows(runner.req_to_token.shape[0])
        self.cache = build_cache(config, runner, self.allocator, eviction, storage_factory)
        self.sampler = Sampler(batch_invariant=config.enable_deterministic_inference)
        #: decode steps replay CUDA graphs that draw the tokens too (their batches carry the
        #: sampling parameters)
        self._graph_sampling = (getattr(runner, "decode_graphs", None) is not None
                                and kernel_enabled())
        #: next-token masks of constrained requests, computed during the next forward
        self.masks = MaskPrefetcher()
        #: observer called after each forward with (batch, sampled token ids); set by Runtime
        #: only when a plugin implements ``engine_after_forward`` (nothing on the hot path else)
        self.after_forward: Callable[[Batch, list[int]], None] | None = None
        self.max_running = runner.req_to_token.shape[0]
        self.max_context_len = runner.req_to_token.shape[1]
        chunk = config.chunked_prefill_size
        if chunk is None:
            chunk = DEFAULT_CHUNKED_PREFILL.get(self.device.type, 2048)
        self.chunk_size = chunk if chunk > 0 else None  #: None: whole prompts
        self.max_prefill_tokens = max(config.max_prefill_tokens, 1)
        #: on CPU, sizes the forward's OpenMP team to the free cores (None: fixed; also with
        #: --enable-deterministic-inference, whose runs must not depend on the machine's load)
        self.cpu_threads = None if config.enable_deterministic_inference else \
            cpu_threads.for_device(self.device)
        self.max_queued = config.max_queued_requests
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self._score_left = prompt_logprobs.MAX_ROWS  #: (reset by each prefill plan)
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._queued = 0
        self._queued_lock = threading.Lock()
        self._last_was_prefill = False
        #: the step in progress: every request that took KV slots for it, with those slots
        #: (freed on failure unless ``_counted``: already counted in the requests' ``kv_len``)
        self._plan: list[tuple[Req, int, list[int]]] = []
        self._counted = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.num_retractions = 0
        self.num_steps = 0
        self.timer = step_timer(config.show_time_cost)
        #: overlap the host's work with the forward (see the module docstring); on a GPU unless
        #: disabled. ``ENGINE_OVERLAP_SCHEDULE=1`` forces it on CPU too (where the forward is
        #: synchronous and nothing is gained: tests), ``0`` turns it off.
        force = os.environ.get("ENGINE_OVERLAP_SCHEDULE", "")
        self.overlap = ((force == "1" or (force != "0" and self.device.type == "cuda"
                                          and not config.disable_overlap_schedule))
                        and speculative is None and not config.is_embedding
                        and not config.enable_deterministic_inference)
        self._inflight: InFlight | None = None
        #: the host's copy of ``req_to_token`` (None: the table is on the host), so releasing a
        #: request never waits for the device
        self._slots_host: torch.Tensor | None = None
        if self.overlap and self.device.type != "cpu":
            self._slots_host = torch.empty(runner.req_to_token.shape, dtype=torch.long)
        self._rng = random.Random(config.random_seed)  #: the ``random`` schedule policy's
        self.retry_interval = config.hicache_storage_prefetch_retry_poll_interval
        self.retry_max = config.hicache_storage_prefetch_retry_max_attempts
        self._deferred = False  #: a request was left queued for a storage read this pass
        #: ``--enable-mixed-chunk``: every prefill chunk shares its forward with decode rows
        prefill_backend = getattr(runner, "prefill_backend", None)
        self._mix_any = config.enable_mixed_chunk and not getattr(prefill_backend,
                                                                 "pads_extend", False)

    # ------------------------------------------------------------------ thread-safe API

    def submit(self, reqs: list[Req]) -> None:
        """Queue requests (all or none); raise :class:`QueueFull` beyond the queue limit."""
        with self._queued_lock:
            if self.max_queued is not None and self._queued + len(reqs) > self.max_queued:
                raise QueueFull(f"too many waiting requests (--max-queued-requests "
                                f"{self.max_queued}); retry later")
            self._queued += len(reqs)
        for req in reqs:
            self._inbox.put(("add", req))

    def abort(self, reqs: list[Req]) -> None:
        """End these requests (the very objects submitted) at the next step boundary; those
        already finished are left alone, and no other request is touched."""
        self._inbox.put(("abort", list(reqs)))

    def flush_cache(self) -> threading.Event:
        """Drop every unlocked radix-cache entry at the next step boundary; set when done."""
        done = threading.Event()
        self._inbox.put(("flush", done))
        return done

    def stats(self) -> SchedulerStats:
        cap = self.allocator.capacity_tokens
        free = self.allocator.free_tokens
        return SchedulerStats(
            num_running=len(self.running) + (1 if self.chunked else 0),
            num_waiting=self._queued, kv_used_tokens=cap - free,
            kv_cached_tokens=self.cache.total_size, kv_capacity_tokens=cap,
            num_retractions=self.num_retractions, num_steps=self.num_steps,
            spec=self.spec.stats if self.spec is not None else None)

    def start(self) -> None:
        """Run :meth:`step` in a new daemon thread until :meth:`stop`.

        The model should have been loaded in that same thread (see
        :func:`engine.runtime.frontend.start_runtime`); :meth:`run` is the loop to call there.
        """
        self._thread = threading.Thread(target=self.run, name="engine-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop of :meth:`run` after the current step; wait for it (30 s at most)."""
        self._stop.set()
        self._inbox.put(("wake", None))
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        self.masks.shutdown()
        self.cache.close()

    def run(self) -> None:
        """Step in the calling thread until :meth:`stop`, sleeping on the inbox when idle."""
        self._thread = threading.current_thread()
        while not self._stop.is_set():
            try:
                if not self.step():
                    self.timer.flush()
                    self._drain_inbox(block=True)
                    self.timer.mark("idle")
            except Exception as exc:  # noqa: BLE001 - keep serving
                log.exception("scheduler loop failed")
                self._reset(failure("in the scheduler loop", exc))

    # ------------------------------------------------------------------ the step

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked or not self._inbox.empty())

    def step(self) -> bool:
        """Run at most one forward; return False when there was nothing to do.

        Never raises: a failure ends the requests it belongs to (see the module docstring).
        """
        self._plan, self._counted = [], False
        try:
            return self._step()
        except Exception as exc:  # noqa: BLE001 - keep serving; fail only what the step held
            log.exception("scheduler step failed")
            self._fail_step(failure("in the model step", exc))
            return True

    def _step(self) -> bool:
        before = self._inflight
        busy = self._schedule_step()
        if self._inflight is not None and self._inflight is before:
            self._resolve()  # no step was launched behind it
            return True
        return busy

    def _schedule_step(self) -> bool:
        self._drain_inbox(block=False)
        self.timer.mark("inbox")
        want_prefill = self.chunked is not None or bool(self.waiting)
        if self.cpu_threads is not None and (want_prefill or self.running):
            self.cpu_threads.update()
        plan: list[tuple[Req, int, list[int]]] = []
        if want_prefill and self.running:
            self._ensure_decode_room()  # first: what it retracts re-enters the queue
        if want_prefill and self.running and (self._mix_any or self._prefill_is_small()):
            kind, size = self._run_mixed()
        elif want_prefill and not (self.running and self._last_was_prefill) and \
                (plan := self._schedule_prefill()):
            kind, size = "extend", len(plan)
            self._run_extend(plan)
        elif self.running:
            kind, size = "decode", len(self.running)
            self._run_decode()
        elif self._deferred:  # only requests waiting for storage reads: pace the passes
            self._deferred = False
            time.sleep(RETRY_PASS_S)
            return True
        else:
            self._last_was_prefill = False
            return False
        self._last_was_prefill = kind == "extend"
        self.timer.end_step(kind, size)
        self.num_steps += 1
        return True

    def _prefill_is_small(self) -> bool:
        """Whether the next prefill has at most ``MIXED_PREFILL_TOKENS`` new tokens, whatever
        requests it admits (an upper bound: cache hits only make it smaller)."""
        total = self.chunked.seq_len - self.chunked.kv_len if self.chunked is not None else 0
        for req in self.waiting:
            if total > MIXED_PREFILL_TOKENS:
                break
            total += req.seq_len
        return total <= MIXED_PREFILL_TOKENS

    def _drain_inbox(self, *, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = item
            if kind == "add":
                self.waiting.append(arg)
                self._prefetch(arg)
            elif kind == "abort":
                self._resolve()
                self._abort(arg)
            elif kind == "flush":
                self.cache.flush()
                arg.set()
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    # ------------------------------------------------------------------ admission

    def _prefetch(self, req: Req) -> None:
        """Start reading ``req``'s uncached prompt pages from the storage tier, if any."""
        try:
            req.prefetch = self.cache.prefetch(req.fill_ids[:-1])
        except Exception:  # noqa: BLE001 - a prefetch only saves work
            log.exception("storage prefetch for request %s failed; it is recomputed", req.rid)

    def _schedule_prefill(self) -> list[tuple[Req, int, list[int]]]:
        """Pick the extend batch: ``(request, new tokens, their slots)``, slots already taken."""
        budget = self.chunk_size or self.max_prefill_tokens
        self._score_left = prompt_logprobs.MAX_ROWS  # prompt positions the step may score
        plan: list[tuple[Req, int, list[int]]] = []
        if self.chunked is not None:
            req = self.chunked
            n = self._extend_amount(req, budget)
            try:
                slots = self._take_slots(req, n)
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                self._fail(req, failure("while taking its KV slots", exc))
            else:
                if slots is None:
                    return []
                budget -= n
                plan.append((req, n, slots))
                self._plan.append(plan[-1])
                if req.kv_len + n < req.seq_len:
                    return plan  # still partial: it keeps the whole budget
                self.chunked = None
        if len(self.waiting) > 1:
            self._order_waiting()
        taken: list[Req] = []  # admitted, or failed while being admitted
        for req in self.waiting:
            if budget <= 0 or len(self.running) + len(plan) >= self.max_running:
                break
            if self.rows.num_free == 0 or (self._score_left <= 0
                                           and prompt_logprobs.wanted(req)):
                break
            if req.prefetch is not None and self._read_storage_again(req):
                self._deferred = True
                continue
            try:
                item = self._admit(req, budget)
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                taken.append(req)
                self._fail(req, failure("while admitting it", exc))
                continue
            if item is None:
                break
            budget -= item[1]
            plan.append(item)
            self._plan.append(item)
            taken.append(req)
            if req.kv_len + item[1] < req.seq_len:
                self.chunked = req
                break
        if taken:
            ids = set(map(id, taken))
            self.waiting = [r for r in self.waiting if id(r) not in ids]
            with self._queued_lock:
                self._queued -= sum(1 for r in taken if r.num_retractions == 0)
        return plan

    def _read_storage_again(self, req: Req) -> bool:
        """Whether ``req`` stays queued this pass for a storage read (see the module
        docstring): its read found nothing and may be issued again, or was issued again and
        has not completed yet."""
        f = req.prefetch
        if self.retry_interval <= 0:
            return False
        req.storage_wait += 1
        if not f.done.is_set():
            if self.cache.awaits(f):
                # the prefetch policy waits for the answer: here, a pass at a time (the others
                # are admitted past it), so that a read that found nothing can be issued
                # again; the interval counts from the answer
                req.storage_wait = 0
                return True
            # best_effort, or the policy's budget is spent: a read issued again gets the
            # interval, then admission goes on with what the faster tiers hold
            return req.storage_retries > 0 and req.storage_wait <= self.retry_interval
        if f.payloads or req.storage_retries >= self.retry_max:
            return False
        if req.storage_wait < self.retry_interval:
            return True
        req.storage_wait = 0
        req.storage_retries += 1
        self._prefetch(req)  # None when the faster tiers now hold the pages
        return req.prefetch is not None

    def _extend_amount(self, req: Req, budget: int) -> int:
        remaining = req.seq_len - req.kv_len
        if self.chunk_size is not None:  # (else whole prompts: the budget limits how many)
            remaining = min(remaining, budget)
        n = prompt_logprobs.chunk_cap(req, req.kv_len, remaining, self._score_left)
        self._score_left -= len(prompt_logprobs.rows(req, req.kv_len, n))
        return n

    def _order_waiting(self) -> None:
        cfg = self.config

        def match(req: Req) -> tuple[int, object]:
            cached, node = self.cache.match_prefix(req.fill_ids[:-1])
            return len(cached), node

        self.waiting = order(cfg.schedule_policy, self.waiting, match=match,
                             running=self.running, now=time.monotonic(), rng=self._rng,
                             by_priority=cfg.enable_priority_scheduling,
                             low_priority_first=cfg.schedule_low_priority_values_first)

    def _admit(self, req: Req, budget: int) -> tuple[Req, int, list[int]] | None:
        """Give ``req`` a row, its cached prefix and its first chunk's slots; None if no room."""
        fill = req.fill_ids
        limit = prompt_logprobs.cache_limit(req)  # (positions it scores are computed again)
        key = fill[:-1] if limit is None else fill[:min(len(fill) - 1, limit)]
        hit = self.cache.admit(key, req.priority, req.prefetch)
        req.prefetch = None
        cached, node = hit.slots, hit.node
        self.cache.inc_lock(node)
        req.prefix_node, req.prefix_len, req.kv_len = node, len(cached), len(cached)
        req.last_slot = int(cached[-1]) if len(cached) else None
        n = self._extend_amount(req, budget)
        reserve = 0
        if self.running:  # leave the running requests some room to decode
            reserve = min(int(ADMIT_DECODE_RESERVE * self.config.schedule_conservativeness),
                          max(0, req.max_new_tokens - len(req.output_ids)))
        need = self.allocator.pages_needed(req.kv_len, n + reserve) * self.page_size
        if not self._make_room(need):
            self.cache.dec_lock(node)
            req.prefix_node, req.prefix_len, req.kv_len, req.last_slot = None, 0, 0, None
            return None
        if req.num_retractions == 0:
            req.cached_tokens = len(cached)
            req.cached_tiers = hit.tiers()
        if req.scheduled_time is None:
            req.scheduled_time = time.monotonic()
        req.row = self.rows.alloc()
        if len(cached):
            self.runner.req_to_token[req.row, :len(cached)] = to_device(cached, self.device)
            if self._slots_host is not None:
                self._slots_host[req.row, :len(cached)] = cached
        slots = self._take_slots(req, n)
        assert slots is not None, "room was made"
        return req, n, slots

    def _make_room(self, tokens: int) -> bool:
        short = tokens - self.allocator.free_tokens
        if short > 0:
            self.cache.evict(short)
        return self.allocator.free_tokens >= tokens

    def _take_slots(self, req: Req, n: int) -> list[int] | None:
        """Allocate slots for ``req``'s next ``n`` tokens (evicting if needed); None if no room."""
        if not self._make_room(self.allocator.pages_needed(req.kv_len, n) * self.page_size):
            return None
        slots, _ = self.allocator.slots_for(req.last_slot, req.kv_len, n)
        if slots:
            req.last_slot = slots[-1]
        return slots

    # ------------------------------------------------------------------ forwards

    def _run_extend(self, plan: list[tuple[Req, int, list[int]]],
                    running: list[Req] | None = None) -> None:
        """Forward ``plan`` as one extend batch, then sample each request whose tokens are now
        all in the KV. ``running``: requests of the plan that were already running (a mixed
        step gives each of them its next token as a one-token extend)."""
        input_ids: list[int] = []
        positions: list[int] = []
        locs: list[int] = []
        prefix_lens: list[int] = []
        extend_lens: list[int] = []
        logits_idx: list[int] = []
        sampled: list[Req] = []
        scored: list[tuple[Req, range]] = []  # prompt positions whose logits score a token
        score_idx: list[int] = []
        for req, n, slots in plan:
            start = req.kv_len
            fill = req.fill_ids
            base = len(input_ids)
            input_ids.extend(fill[start:start + n])
            positions.extend(range(start, start + n))
            locs.extend(slots)
            prefix_lens.append(start)
            extend_lens.append(n)
            if start + n == len(fill):
                logits_idx.append(len(input_ids) - 1)
                sampled.append(req)
            picked = prompt_logprobs.rows(req, start, n)
            if picked:
                scored.append((req, picked))
                score_idx.extend(base + q - start for q in picked)
        reqs = [item[0] for item in plan]
        self.timer.mark("schedule")
        batch = self._batch(ForwardMode.EXTEND, reqs, input_ids, positions, locs, prefix_lens,
                            extend_lens, logits_idx + score_idx)
        self.timer.mark("batch")
        logits = self.runner.forward(batch)
        self.timer.mark("forward")
        for req, n in zip(reqs, extend_lens):
            req.kv_len += n
        self._counted = True
        if scored:  # (the sampled rows first, then the scored ones)
            self._score_prompts(scored, logits[len(logits_idx):])
            logits = logits[:len(logits_idx)]
        if sampled:
            self._process(sampled, logits, batch)
            already = set(map(id, running or ()))
            self.running.extend(r for r in sampled if not r.finished and id(r) not in already)

    def _score_prompts(self, scored: list[tuple[Req, range]], logits: torch.Tensor) -> None:
        """Record the prompt tokens' log-probabilities that ``logits`` give (one row per
        position of ``scored``); a request for which that raises fails alone."""
        try:
            prompt_logprobs.record(scored, logits)
        except Exception as exc:  # noqa: BLE001 - their requests fail, the step goes on
            for req, _ in scored:
                self._fail(req, failure("while scoring its prompt", exc))

    def _run_mixed(self) -> tuple[str, int]:
        """The running requests' next tokens and a small prefill in one forward (a plain decode
        when no prefill can be admitted); returns the step's kind and size. The caller has
        ensured decode room for every running request."""
        decode = self._take_decode_slots()
        plan = self._schedule_prefill()
        if not plan:
            self._forward_decode(decode)
            return "decode", len(decode)
        self._run_extend(plan + decode, [req for req, _, _ in decode])
        return "mixed", len(plan) + len(decode)

    def _run_decode(self) -> None:
        self._ensure_decode_room()
        decode = self._take_decode_slots()
        if decode and not (self.spec is not None and self.spec.verify(self, decode)):
            self._forward_decode(decode)

    def _take_decode_slots(self) -> list[tuple[Req, int, list[int]]]:
        """A slot for the next token of each running request (room was ensured); a request
        whose slot cannot be taken fails alone."""
        decode: list[tuple[Req, int, list[int]]] = []
        for req in list(self.running):
            if req.unresolved and (len(req.output_ids) >= req.max_new_tokens
                                   or req.seq_len >= self.max_context_len):
                continue  # its token on the device is its last: it ends when read back
            try:
                slots = self._take_slots(req, 1)
                assert slots is not None, "room was ensured"
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                self._fail(req, failure("while taking its KV slots", exc))
                continue
            decode.append((req, 1, slots))
        self._plan.extend(decode)
        return decode

    def _forward_decode(self, decode: list[tuple[Req, int, list[int]]]) -> None:
        """One decode forward: the next token of each request into its slot."""
        if not decode:
            return
        reqs = [req for req, _, _ in decode]
        locs = [slots[0] for _, _, slots in decode]
        input_ids = [r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1] for r in reqs]
        positions = [r.kv_len for r in reqs]
        self.timer.mark("schedule")
        batch = self._batch(ForwardMode.DECODE, reqs, input_ids, positions, locs, positions,
                            [1] * len(reqs), list(range(len(reqs))))
        self.timer.mark("batch")
        logits = self.runner.forward(batch)
        self.timer.mark("forward")
        for req in reqs:
            req.kv_len += 1
        self._counted = True
        self._process(reqs, logits, batch)

    def _ensure_decode_room(self) -> None:
        """Free pages for one more token per running request: evict, then (after reading back
        the step in flight, which may end some) retract."""
        while self.running:
            need = sum(self.allocator.pages_needed(r.kv_len, 1) for r in self.running)
            if self._make_room(need * self.page_size):
                return
            if self._inflight is not None:
                self._resolve()
                continue
            if len(self.running) == 1 and self.chunked is None:
                req = self.running[0]
                log.warning("request %s ended: the KV cache holds no more of it", req.rid)
                finish(req, {"type": "length", "message": "KV cache capacity reached"})
                self._emit_and_release([req])
                return
            if len(self.running) == 1:
                self._retract_chunked()
                continue
            self._retract(self.running.pop(retraction_victim(
                self.config.retraction_policy, self.running,
                low_priority_first=self.config.schedule_low_priority_values_first)))

    def _retract(self, req: Req) -> None:
        """Put a running request back in the queue; its KV goes to the cache (or is freed)."""
        self.num_retractions += 1
        req.num_retractions += 1
        self._release(req)
        self.waiting.insert(0, req)
        log.info("retracted request %s (KV cache full); it continues later", req.rid)

    def _retract_chunked(self) -> None:
        req = self.chunked
        assert req is not None
        self.chunked = None
        self._retract(req)

    def _batch(self, mode: ForwardMode, reqs: list[Req], input_ids: list[int],
               positions: list[int], locs: list[int], prefix_lens: list[int],
               extend_lens: list[int], logits_idx: list[int]) -> Batch:
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        rows = [r.row for r in reqs]
        row_idx = [row for row, e in zip(rows, extend_lens) for _ in range(e)]
        # a request whose last token is still on the device: its placeholder (the last of its
        # new tokens) is filled there from the step in flight
        dst: list[int] = []
        src: list[int] = []
        if self._inflight is not None:
            end = 0
            for req, e in zip(reqs, extend_lens):
                end += e
                if req.unresolved:
                    assert input_ids[end - 1] < 0, "only a request's newest token is unresolved"
                    dst.append(end - 1)
                    src.append(req.future_row)
        # a decode step replayed from a CUDA graph draws its tokens there: the sampling
        # parameters go with the batch
        graphed = mode is ForwardMode.DECODE and self._graph_sampling
        sample = [v for part in sample_lists(reqs) for v in part] if graphed else []
        # every small index vector in one host-to-device copy that does not wait for the device
        (ids_t, pos_t, loc_t, row_idx_t, rows_t, seq_t, prefix_t, extend_t, logits_t, dst_t,
         src_t, sample_t), host = pack_to_device([input_ids, positions, locs, row_idx, rows,
                                                  seq_lens, prefix_lens, extend_lens,
                                                  logits_idx, dst, src, sample], self.device)
        if dst:
            assert self._inflight is not None
            ids_t[dst_t] = self._inflight.drawn.token_ids[src_t]
        self.runner.req_to_token[row_idx_t, pos_t] = loc_t
        if self._slots_host is not None:
            self._slots_host[host[3], host[1]] = host[2]
        return Batch(
            mode=mode, input_ids=ids_t, positions=pos_t, out_cache_loc=loc_t,
            req_pool_indices=rows_t, seq_lens=seq_t, prefix_lens=prefix_t, extend_lens=extend_t,
            req_to_token=self.runner.req_to_token,
            seq_lens_cpu=seq_lens, prefix_lens_cpu=list(prefix_lens),
            extend_lens_cpu=list(extend_lens), logits_indices=logits_t,
            sampling=[r.sampling_params for r in reqs],
            sample_args=sample_t.view(6, len(reqs)) if graphed else None,
        )

    # ------------------------------------------------------------------ results

    def _process(self, reqs: list[Req], logits: torch.Tensor, batch: Batch) -> None:
        """Sample each request's next token; append, finish and emit it now, or - overlapping,
        when no request's sampling reads its generated tokens - after the next step has been
        launched (:meth:`_resolve`). A request whose sampling row, finishing or delivery
        raises fails alone. With ``--is-embedding`` ``logits`` are the prompts' embeddings:
        each request ends with its own (:meth:`_finish_embeddings`)."""
        if self.config.is_embedding:
            self._finish_embeddings(reqs, logits)
            if self.after_forward is not None:
                self.after_forward(batch, [])
            return
        if self.overlap and all(map(_deferrable, reqs)):
            drawn = self.sampler.draw(logits, reqs, batch.drawn_ids).to_host()
            self.timer.mark("sample")
            for i, req in enumerate(reqs):
                if i in drawn.errors:  # its draw raised: it ends now, its row is dropped
                    self._fail(req, failure("while sampling", drawn.errors[i]))
                    continue
                req.output_ids.append(-1)
                req.unresolved += 1
                req.future_row = i
            previous, self._inflight = self._inflight, InFlight(reqs, drawn, batch,
                                                                logits.shape[1])
            if previous is not None:
                self._resolve(previous)
            return
        self._resolve()
        out = self.sampler(logits, reqs, batch.drawn_ids)
        self.timer.mark("sample")
        self._finish_step(reqs, out, batch, logits.shape[1])

    def _resolve(self, step: InFlight | None = None) -> None:
        """Read back ``step`` (by default the step in flight, if any) and finish and emit its
        tokens. When that read fails, its requests fail with it."""
        if step is None:
            step, self._inflight = self._inflight, None
            if step is None:
                return
        try:
            if step.drawn.event is not None:
                self.runner.synchronize(step.drawn.event)
            out = step.drawn.result()
        except Exception as exc:
            for req in step.reqs:
                if not req.finished:
                    self._fail(req, failure("while reading its token back", exc))
            raise
        self.timer.mark("read back")
        self._finish_step(step.reqs, out, step.batch, step.vocab)

    def _finish_step(self, reqs: list[Req], out: SampleOutput, batch: Batch,
                     vocab: int) -> None:
        """Append each request's token of ``out``, check whether it finished, emit, release;
        a request that ended while its token was on the device gets nothing."""
        now = time.monotonic()
        items: list[tuple[Sink, ReqOutput]] = []
        senders: list[Req] = []
        done: list[Req] = []
        for i, req in enumerate(reqs):
            if req.finished:
                continue
            if out.errors and i in out.errors:
                exc = out.errors[i]
                delta = error_output(req, sample_failure(exc))
            else:
                try:
                    delta = next_output(req, out, i, now, self.max_context_len)
                except Exception as exc:  # noqa: BLE001 - this request fails alone
                    delta = error_output(req, failure("while finishing its token", exc))
            items.append((req.sink, delta))
            senders.append(req)
            if req.finished:
                done.append(req)
        self.timer.mark("finish")
        # the next masks of the constrained requests go on during the emit and the next forward
        self.masks.prefetch(senders, vocab)
        self._deliver(senders, items, done)
        if self.after_forward is not None:
            self.after_forward(batch, list(out.token_ids))

    def _deliver(self, reqs: list[Req], items: list[tuple[Sink, ReqOutput]],
                 done: list[Req]) -> None:
        """Emit ``items`` (one per request of ``reqs``, in order); a request whose output could
        not be delivered is ended with an error; then release ``done`` and those."""
        for k in emit(items):
            req = reqs[k]
            if not req.finished:
                message = "internal error while delivering its output (see the server log)"
                emit([(req.sink, error_output(req, message))])
                done.append(req)
        self.timer.mark("emit")
        if done:
            self.running = [r for r in self.running if not r.finished]
            for req in done:
                self._release(req)
            self.timer.mark("release")

    def _finish_embeddings(self, reqs: list[Req], embeddings: torch.Tensor) -> None:
        """End each prompt-complete request with its embedding (row ``i`` of ``embeddings``)."""
        rows = embeddings.tolist()
        items: list[tuple[Sink, ReqOutput]] = []
        for req, row in zip(reqs, rows):
            req.finish_reason = {"type": "stop"}
            delta = ReqOutput(rid=req.rid, embedding=row)
            fill_counts(req, delta)
            items.append((req.sink, delta))
        emit(items)
        for req in reqs:
            self._release(req)
        self.timer.mark("emit")

    # ------------------------------------------------------------------ release / abort

    def _release(self, req: Req) -> None:
        """Give back the row; hand the request's page-aligned KV to the cache, free the rest."""
        if req.row is not None:
            p = self.page_size
            kv = req.kv_len
            slots = (self._slots_host[req.row, :kv] if self._slots_host is not None
                     else self.runner.req_to_token[req.row, :kv].to("cpu"))
            known = min(kv, req.known_len)  # an unresolved token's id is not known yet
            aligned = known - known % p
            if aligned > req.prefix_len:
                present = self.cache.insert(req.fill_ids[:aligned], slots[:aligned],
                                            req.priority)
                if present > req.prefix_len:
                    self.allocator.free_slots(slots[req.prefix_len:present])
            else:
                aligned = req.prefix_len
            if kv > aligned:
                self.allocator.free_slots(slots[aligned:kv])
            self.rows.free(req.row)
        if req.prefix_node is not None:
            self.cache.dec_lock(req.prefix_node)
        req.row, req.prefix_node, req.prefix_len, req.kv_len = None, None, 0, 0
        req.last_slot = None
        if req.unresolved:  # tokens of steps in flight that it will never get
            del req.output_ids[-req.unresolved:]
            req.unresolved = 0
        if self.spec is not None:
            self.spec.release(req)

    def _free_pending(self, req: Req, slots: list[int]) -> None:
        """Free the pages taken for ``req``'s tokens from ``kv_len`` on (``slots``, not counted
        in its ``kv_len``); the first of them may continue the page of token ``kv_len - 1``,
        which stays."""
        room = -req.kv_len % self.page_size  # slots left in that page
        self.allocator.free_slots(slots[room:])

    def _emit_and_release(self, reqs: list[Req]) -> None:
        deltas = []
        for req in reqs:
            delta = ReqOutput(rid=req.rid, text=new_text(req))
            fill_counts(req, delta)
            deltas.append((req.sink, delta))
        emit(deltas)
        for req in reqs:
            if req in self.running:
                self.running.remove(req)
            if self.chunked is req:
                self.chunked = None
            self._release(req)

    def _abort(self, reqs: list[Req]) -> None:
        targets = set(map(id, reqs))
        hit = [r for r in self.waiting if id(r) in targets]
        if hit:
            self.waiting = [r for r in self.waiting if id(r) not in targets]
            with self._queued_lock:
                self._queued -= sum(1 for r in hit if r.num_retractions == 0)
        hit += [r for r in self.running if id(r) in targets]
        if self.chunked is not None and id(self.chunked) in targets:
            hit.append(self.chunked)
        for req in hit:
            req.finish_reason = {"type": "abort", "message": "request aborted"}
        self._emit_and_release(hit)

    # ------------------------------------------------------------------ failures

    def _fail(self, req: Req, message: str) -> None:
        """End ``req`` alone with an internal error before it took slots for this step: tell
        its sink, take it out of the running set, free its KV."""
        emit([(req.sink, error_output(req, message))])
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        self._release(req)

    def _fail_step(self, message: str) -> None:
        """Fail the requests of the step that raised - each once - and free their KV; the
        others go on. Reset everything holding KV when there is no step to blame, or when
        this clean-up raises too."""
        if self._plan:
            try:
                self._fail_plan(message)
                return
            except Exception:  # noqa: BLE001 - the bookkeeping is suspect: start over
                log.exception("cleaning up after the failed step failed")
        self._reset(message)

    def _fail_plan(self, message: str) -> None:
        plan, self._plan = self._plan, []
        reqs = [req for req, _, _ in plan]
        ids = set(map(id, reqs))
        emit([(r.sink, error_output(r, message)) for r in reqs if not r.finished])
        self.running = [r for r in self.running if id(r) not in ids]
        if self.chunked is not None and id(self.chunked) in ids:
            self.chunked = None
        queued = [r for r in self.waiting if id(r) in ids]  # admitted while the step raised
        if queued:
            self.waiting = [r for r in self.waiting if id(r) not in ids]
            with self._queued_lock:
                self._queued -= sum(1 for r in queued if r.num_retractions == 0)
        for req, _, slots in plan:
            if not self._counted and req.row is not None:
                self._free_pending(req, slots)
            self._release(req)

    def _reset(self, message: str) -> None:
        """Fail every request that holds KV (running, chunked, taken into this step) and start
        the KV memory over; the waiting queue, which holds none, stays."""
        holding = [r for r in self.waiting if r.row is not None or r.prefix_node is not None]
        reqs = list({id(r): r for r in [*self.running, *([self.chunked] if self.chunked else []),
                                        *(req for req, _, _ in self._plan), *holding]
                     }.values())
        if holding:
            self.waiting = [r for r in self.waiting if r.row is None and r.prefix_node is None]
            with self._queued_lock:
                self._queued -= sum(1 for r in holding if r.num_retractions == 0)
        emit([(r.sink, error_output(r, message)) for r in reqs if not r.finished])
        for req in reqs:
            req.row, req.prefix_node, req.prefix_len, req.kv_len = None, None, 0, 0
            req.last_slot = None
            if self.spec is not None:
                self.spec.release(req)
        self.running, self.chunked, self._plan = [], None, []
        self._inflight = None
        self.allocator.reset()
        self.cache.reset()
        self.rows = ReqToTokenRows(self.max_running)


def _deferrable(req: Req) -> bool:
    """Whether ``req``'s next token can be drawn before its last one is read back: its
    sampling reads none of its generated tokens (no penalties, grammar or logit processor)."""
    return (req.grammar is None and req.logit_processor is None
            and not req.sampling_params.has_penalties)
