"""The runtime shared by the HTTP server and the offline :class:`~engine.runtime.offline.Engine`:
a model runner, its scheduler, and the checks that turn a prompt + :class:`SamplingParams` into
scheduler requests (``n`` sequences each).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import threading
import time
import uuid
from typing import Any

import torch

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.models.tokenizer import IncrementalDetokenizer, NoDetokenizer
from engine.runtime.grammar import Grammars
from engine.runtime.request import Req, Sink
from engine.runtime.sampling import InvalidParam, SamplingParams
from engine.runtime.scheduler import Scheduler

log = logging.getLogger("engine.runtime")

#: the fields of a model's generation_config.json that ``--sampling-defaults model`` reads
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(config: ServerConfig, model_dir: str | None) -> dict[str, Any]:
    """Sampling parameters a request that does not give them gets: the model's
    ``generation_config.json`` (with ``--sampling-defaults model``), then
    ``--preferred-sampling-params`` over it. Raises :class:`ConfigError` for preferred
    parameters that are not valid sampling parameters."""
    out: dict[str, Any] = {}
    path = os.path.join(model_dir, "generation_config.json") if model_dir else ""
    if config.sampling_defaults == "model" and path and os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            gen = json.load(fh)
        if gen.get("do_sample", True) is False:
            out["temperature"] = 0.0
        out.update({k: gen[k] for k in GENERATION_CONFIG_KEYS
                    if k in gen and not (k == "temperature" and "temperature" in out)})
    if config.preferred_sampling_params:
        out.update(json.loads(config.preferred_sampling_params))
    try:
        SamplingParams.from_dict(out)
    except (InvalidParam, TypeError) as exc:
        raise ConfigError(f"sampling defaults {json.dumps(out)}: {exc}") from None
    return out


class RequestError(ValueError):
    """A request the runtime cannot serve: ``status`` (HTTP), ``param`` (field), ``code``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param, self.status, self.code, self.type = param, status, code, type


def startup_phase(runner: Any, name: str) -> Any:
    """``runner.phase(name)`` (timed into its start-up phases), or nothing for a runner that
    does not time phases."""
    phase = getattr(runner, "phase", None)
    return phase(name) if phase is not None else contextlib.nullcontext()


class Runtime:
    """Model runner + scheduler. Thread-safe entry points: :meth:`make_reqs`,
    :meth:`claim_rid`/:meth:`release_rid` and the scheduler's ``submit``/``abort``."""

    def __init__(self, config: ServerConfig, assembly: Any = None, *, runner: Any = None) -> None:
        """Build the model runner from ``config``'s :class:`~engine.assembly.Assembly` (built
        here when not given), or use a ready ``runner``, and a scheduler."""
        from engine.assembly import Assembly, ParserFactories
        from engine.runtime.model_runner import ModelRunner

        t0 = time.monotonic()
        self.config = config
        if runner is None:
            assembly = assembly if assembly is not None else Assembly(config)
            runner = ModelRunner(config, assembly)
        self.runner = runner
        self.tokenizer = self.runner.tokenizer
        self.model_config = self.runner.model_config
        eviction = assembly.eviction_policy() if assembly is not None else None
        storage = assembly.hicache_storage if assembly is not None else None
        spec = assembly.speculative(self.runner) if assembly is not None else None
        self.scheduler = Scheduler(config, self.runner, eviction=eviction,
                                   storage_factory=storage, speculative=spec)
        self.context_len = self.scheduler.max_context_len
        self.kv_capacity = self.scheduler.allocator.capacity_tokens
        self.vocab_size = self.model_config.vocab_size
        self.eos_ids = frozenset(
            self.tokenizer.eos_token_ids if self.tokenizer is not None else ()) | frozenset(
            self.model_config.eos_token_ids)
        self._rng = random.Random(config.random_seed)
        self._rids: set[str] = set()
        self._rids_lock = threading.Lock()
        #: what requests that give no sampling parameters get (:func:`sampling_defaults`)
        self.sampling_defaults = sampling_defaults(config, self.model_config.model_path)
        if self.sampling_defaults:
            log.info("sampling defaults: %s", json.dumps(self.sampling_defaults))
        #: the chat parsers' factories (built once here, from the tokenizer's chat template)
        self.parsers = ParserFactories()
        self.observers = None
        #: constrained decoding (None without a tokenizer, an assembly or a grammar plugin)
        self.grammars: Grammars | None = None
        #: the custom logit processors by name (None: ``--enable-custom-logit-processor`` is off)
        self.logit_processors = None
        if config.enable_custom_logit_processor:
            from engine.runtime.logit_processors import load_processors

            self.logit_processors = load_processors()
        if assembly is not None:
            template = self.tokenizer.chat_template if self.tokenizer is not None else None
            self.parsers = assembly.parser_factories(template)
            # the backend is built on first use (by the first constrained request)
            grammar = assembly.grammar_backend_name() if self.tokenizer is not None else None
            if grammar is not None:
                tokenizer, vocab = self.tokenizer, self.vocab_size
                self.grammars = Grammars(
                    factory=lambda: assembly.grammar_backend(tokenizer, vocab),
                    name=f"--grammar-backend {grammar}")
            # cross-cutting hooks of the selected plugins (engine.plugins.hookspecs)
            self.observers = assembly.observers()
            self.scheduler.after_forward = self.observers.after_forward
            self.observers.startup(config)
        self.load_seconds = time.monotonic() - t0

    def check_prompt(self, input_ids: list[int], *, param: str = "prompt") -> None:
        """Reject an empty prompt, ids outside the vocabulary, or a prompt that cannot fit."""
        if not input_ids:
            raise RequestError("the prompt is empty", param=param)
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= self.vocab_size
               for t in input_ids):
            raise RequestError(f"token ids must be integers in [0, {self.vocab_size})",
                               param=param)
        if len(input_ids) >= self.context_len:
            raise RequestError(f"the prompt has {len(input_ids)} tokens; this model's context "
                               f"length is {self.context_len} (prompt + output)", param=param,
                               code="context_length_exceeded")
        if len(input_ids) + 1 > self.kv_capacity:
            raise RequestError(f"the prompt has {len(input_ids)} tokens; the KV cache holds "
                               f"{self.kv_capacity}", param=param,
                               code="context_length_exceeded")

    def max_new_tokens(self, prompt_len: int, params: SamplingParams,
                       param: str = "max_tokens") -> int:
        """The resolved output limit: ``None`` means up to the context length."""
        room = self.context_len - prompt_len
        if params.max_new_tokens is None:
            return room
        if params.max_new_tokens > room:
            raise RequestError(f"{param} is {params.max_new_tokens}, but the prompt has "
                               f"{prompt_len} tokens and the context length is "
                               f"{self.context_len}: at most {room} more fit", param=param,
                               code="context_length_exceeded")
        return params.max_new_tokens

    def claim_rid(self, rid: str | None) -> str:
        """An id that no request in flight has: ``rid`` itself (a :class:`RequestError`, 400
        naming ``rid``, when a request in flight already has it), or a fresh one when ``rid``
        is None or empty; a rid that is not valid Unicode text (a lone surrogate) is refused
        too. Give it back with :meth:`release_rid` once every sequence of the request has
        finished."""
        try:
            (rid or "").encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError("rid must be valid Unicode text", param="rid") from None
        with self._rids_lock:
            if not rid:
                rid = uuid.uuid4().hex
            elif rid in self._rids:
                raise RequestError(f"a request with rid {rid!r} is already in flight; a rid "
                                   "must be unique among the requests in flight", param="rid",
                                   code="duplicate_rid")
            self._rids.add(rid)
        return rid

    def release_rid(self, rid: str) -> None:
        with self._rids_lock:
            self._rids.discard(rid)

    def truncate(self, input_ids: list[int], params: SamplingParams) -> list[int]:
        """``input_ids`` cut from the left so that it and its output fit (the context length
        less ``max_new_tokens``, or one token when unset; the KV cache), when it does not."""
        keep = min(self.context_len - (params.max_new_tokens or 1), self.kv_capacity - 1)
        if keep < 1 or len(input_ids) <= keep:
            return input_ids
        log.info("prompt of %d tokens truncated to its last %d", len(input_ids), keep)
        return input_ids[-keep:]

    def make_reqs(self, rid: str, input_ids: list[int], params: SamplingParams, sink: Sink, *,
                  param: str = "prompt", max_tokens_param: str = "max_tokens",
                  priority: int | None = None, routing_key: str | None = None,
                  grammars: list[Any] | None = None,
                  logit_processor: Any = None) -> list[Req]:
        """Validated scheduler requests for one prompt: one per ``n`` (ids ``rid`` or
        ``rid-i``; the ids name requests in logs and outputs, aborts take the objects).
        Sequence ``i`` of a seeded request draws with the seed ``(seed + i) mod 2**64``, and
        is constrained by ``grammars[i]`` when given (from :meth:`Grammars.matchers`). A
        prompt that does not fit is cut from the left with ``--allow-auto-truncate``
        (:meth:`truncate`). ``priority`` defaults to ``--default-priority-value``;
        ``logit_processor`` is the request's custom logit processor, if any. Raises
        :class:`RequestError`."""
        if self.config.allow_auto_truncate:
            input_ids = self.truncate(input_ids, params)
        self.check_prompt(input_ids, param=param)
        params.validate(self.vocab_size)
        if params.logprob_start_len >= len(input_ids):
            raise RequestError(f"logprob_start_len is {params.logprob_start_len}, but the "
                               f"prompt has {len(input_ids)} tokens (positions from 0)",
                               param="logprob_start_len")
        limit = self.max_new_tokens(len(input_ids), params, max_tokens_param)
        stop_ids = frozenset(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_ids
        reqs = []
        for i in range(params.n):
            gen = None
            if not params.is_greedy:
                seed = ((params.seed + i) % 2**64 if params.seed is not None
                        else self._rng.getrandbits(63))
                gen = torch.Generator(device=self.runner.device).manual_seed(seed)
            reqs.append(Req(
                rid=rid if params.n == 1 else f"{rid}-{i}", origin_input_ids=list(input_ids),
                sampling_params=params, sink=sink, stop_ids=stop_ids, generator=gen,
                max_new_tokens=limit, routing_key=routing_key,
                priority=self.config.default_priority_value if priority is None else priority,
                grammar=grammars[i] if grammars else None, logit_processor=logit_processor,
                detokenizer=NoDetokenizer() if self.tokenizer is None else
                IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens, input_ids)))
        if self.observers is not None and self.observers.on_request is not None:
            for req in reqs:
                self.observers.on_request(req)
        return reqs

    def info(self) -> dict[str, Any]:
        mc = self.model_config
        return {"model_path": mc.model_path, "gguf_file": mc.gguf_file,
                "architecture": mc.architecture, "context_length": self.context_len,
                "vocab_size": self.vocab_size, "dtype": str(self.runner.dtype).replace(
                    "torch.", ""), "device": str(self.runner.device),
                "kv_capacity_tokens": self.kv_capacity, "page_size": self.scheduler.page_size,
                "max_running_requests": self.scheduler.max_running,
                "chunked_prefill_size": self.scheduler.chunk_size}

    def shutdown(self) -> None:
        self.scheduler.stop()
        if self.grammars is not None:
            self.grammars.shutdown()
        if self.observers is not None:
            self.observers.shutdown()


def start_runtime(config: ServerConfig, assembly: Any = None) -> Runtime:
    """Build a :class:`Runtime` in a new daemon thread that then runs its scheduler loop.

    Returns once the model is loaded (re-raising what the load raised). Loading and stepping
    in one thread keeps every torch kernel of the process in that thread: GNU OpenMP keeps a
    worker pool per thread that ever ran a parallel kernel, and once it manages more threads
    than there are cores its workers stop spin-waiting between kernels, which made each CPU
    forward about 1.5x slower when the model was loaded in the main thread and run in another.
    """
    box: queue.Queue[Runtime | BaseException] = queue.Queue(maxsize=1)

    def main() -> None:
        try:
            runtime = Runtime(config, assembly)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            box.put(exc)
            return
        box.put(runtime)
        runtime.scheduler.run()

    threading.Thread(target=main, name="engine-scheduler", daemon=True).start()
    result = box.get()
    if isinstance(result, BaseException):
        raise result
    return result
