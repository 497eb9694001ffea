"""The HTTP server: FastAPI routes over one :class:`~engine.runtime.frontend.Runtime`.

Routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``
(OpenAI; embeddings with ``--is-embedding``, which refuses the generation routes), ``/generate``
(native), ``/health``, ``/health_generate``, ``/get_model_info``, ``/metrics``, and the admin
routes ``/flush_cache`` (POST), ``/get_server_info``. Every request first passes
:class:`GuardMiddleware` (shutdown, Host, Origin, keys, content type, body). Every error is
``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status (a 503 also says
``Retry-After``); a bad request never disturbs the others.

The scheduler runs in its own thread; handlers only submit requests and await their outputs.
SIGTERM or SIGINT drains the server (:meth:`~engine.server.state.Drain.run`) before it exits.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import ipaddress
import logging
import os
import sys
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import engine
from engine.config import ServerConfig
from engine.assembly import Assembly
from engine.models.completion_templates import load_completion_template
from engine.runtime.frontend import RequestError, Runtime, start_runtime, startup_phase
from engine.runtime.logit_processors import choose as choose_processor
from engine.runtime.sampling import InvalidParam, SamplingParams
from engine.runtime.watchdog import watch_forwards
from engine.server.generation import (ClientGone, Generation, SeqState, grammar_matchers,
                                      internal_failure)
from engine.server.metrics import Metrics
from engine.server.openai_api import OpenAIServing, error_body, sse, sse_response
from engine.server.protocol import (GENERATE_CONSTRAINT_FIELDS, ChatCompletionRequest,
                                    CompletionRequest, DetokenizeRequest, EmbeddingRequest,
                                    GenerateRequest, ScoreRequest, TokenizeRequest,
                                    constraint, parse_body, to_sampling_params)
from engine.server.state import RETRY_AFTER_S, Drain, ServerState

log = logging.getLogger("engine.serve")

MIN_BODY_LIMIT = 8 * 2**20  #: bytes; raised for long contexts (about 64 bytes per token)
ADMIN_ROUTES = frozenset({"/flush_cache", "/get_server_info", "/server_info"})


def _model_name(config: ServerConfig, runtime: Runtime) -> str:
    if config.served_model_name:
        return config.served_model_name
    mc = runtime.model_config
    path = mc.gguf_file or mc.model_path
    base = os.path.basename(os.path.normpath(path))
    return base[:-5] if base.endswith(".gguf") else base


# ---------------------------------------------------------------------- ASGI middleware


def _json_error(status: int, message: str, *, type: str, code: Any = None,
                headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type=type, code=code or status),
                        status_code=status, headers=headers)


class _Refused(Exception):
    """Raised by the guard's checks: the response that answers the request instead."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class GuardMiddleware:
    """The checks every HTTP request passes before a route sees it, in this order:

    * while the server shuts down (:attr:`Drain.draining`): 503 with ``Retry-After``;
    * without ``--api-key``, the ``Host`` must name this server: an IP address, ``localhost``,
      ``--host`` or one of ``--allowed-hosts`` (else 403: a web page served from a DNS name
      that resolves here must not drive a keyless server);
    * an ``Origin`` other than the server's own must be one of ``--cors-allow-origins`` (403);
    * the key, compared in constant time (401): ``--admin-api-key`` on :data:`ADMIN_ROUTES`
      when it is set, else ``--api-key`` on every route but ``/health``;
    * a request with a body must say ``Content-Type: application/json`` (415), and send the
      body within ``--request-read-timeout`` (408) and the size limit (413).

    A request that passes runs inside :meth:`Drain.track`, its body already read in full.
    """

    def __init__(self, app: ASGIApp, config: ServerConfig, drain: Drain, max_body: int) -> None:
        self.app, self.config, self.drain, self.max_body = app, config, drain, max_body
        self.host_names = {"localhost", config.host.lower(),
                           *(h.lower() for h in config.allowed_hosts)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self._check(scope["path"], headers)
            if _has_body(headers):
                body = await self._read_body(headers, receive)
                if body is None:  # the client left
                    return
                receive = _replay(body, receive)
        except _Refused as refused:
            await refused.response(scope, receive, send)
            return
        with self.drain.track():
            await self.app(scope, receive, send)

    def _check(self, path: str, headers: Headers) -> None:
        if self.drain.draining:
            raise _Refused(_json_error(
                503, "the server is shutting down; retry the request", type="server_unavailable",
                code="shutting_down", headers={"Retry-After": str(RETRY_AFTER_S),
                                               "Connection": "close"}))
        host = headers.get("host")
        if self.config.api_key is None and host is not None and not self._host_allowed(host):
            raise _Refused(_json_error(
                403, f"this server does not answer to the host name in 'Host: {host}'; allow "
                "it with --allowed-hosts (or set --api-key)", type="permission_error",
                code="host_not_allowed"))
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host or ""):
            raise _Refused(_json_error(
                403, f"cross-origin request from '{origin}' refused; allow the origin with "
                "--cors-allow-origins", type="permission_error", code="origin_not_allowed"))
        admin = self.config.admin_api_key is not None and path in ADMIN_ROUTES
        key = self.config.admin_api_key if admin else self.config.api_key
        if key is not None and path != "/health" and not _key_matches(headers, key):
            raise _Refused(_json_error(
                401, f"missing or invalid {'admin ' if admin else ''}API key (send "
                "'Authorization: Bearer KEY')", type="authentication_error",
                code="invalid_api_key"))
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        if _has_body(headers) and media != "application/json" and \
                not (media.startswith("application/") and media.endswith("+json")):
            raise _Refused(_json_error(
                415, f"the request body must be JSON, sent with 'Content-Type: "
                f"application/json' (got {media or 'no Content-Type'!r})",
                type="invalid_request_error", code="unsupported_media_type"))

    def _host_allowed(self, host: str) -> bool:
        """An IP address (a page cannot rebind one), or a name this server answers to."""
        name = host.strip().lower()
        name = name[1:].partition("]")[0] if name.startswith("[") else name.partition(":")[0]
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return any(p == "*" or p == name or (p.startswith("*.") and name.endswith(p[1:]))
                       for p in self.host_names)

    def _origin_allowed(self, origin: str, host: str) -> bool:
        """The server's own origin (a page it served itself), or one of the CORS origins."""
        allowed = self.config.cors_allow_origins
        return origin.partition("://")[2].lower() == host.lower() or "*" in allowed or \
            origin in allowed

    async def _read_body(self, headers: Headers, receive: Receive) -> bytes | None:
        """The whole body, or None when the client left; :class:`_Refused` when too large or
        too slow (both close the connection)."""
        too_large = _Refused(_json_error(
            413, f"request body larger than {self.max_body} bytes", type="invalid_request_error",
            code="request_too_large", headers={"Connection": "close"}))
        if int(headers.get("content-length", "0")) > self.max_body:
            raise too_large
        chunks, total, more = [], 0, True
        try:
            async with asyncio.timeout(self.config.request_read_timeout):
                while more:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return None
                    chunks.append(msg.get("body", b""))
                    total += len(chunks[-1])
                    if total > self.max_body:
                        raise too_large
                    more = msg.get("more_body", False)
        except TimeoutError:
            raise _Refused(_json_error(
                408, f"the request body did not arrive within "
                f"{self.config.request_read_timeout:g} s (--request-read-timeout)",
                type="invalid_request_error", code="request_timeout",
                headers={"Connection": "close"})) from None
        return b"".join(chunks)


def _has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers


def _key_matches(headers: Headers, key: str) -> bool:
    auth = headers.get("authorization", "")
    token = auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
    return hmac.compare_digest(token.encode(), key.encode())


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` first, then what ``receive`` gives (a disconnect)."""
    first: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again() -> Message:
        return first.pop() if first else await receive()

    return receive_again


# ---------------------------------------------------------------------- the app


def create_app(state: ServerState) -> FastAPI:
    """The FastAPI app over a started runtime (its scheduler thread already running)."""
    app = FastAPI(title="engine", version=engine.__version__, docs_url=None, redoc_url=None)
    app.state.server = state
    oai = OpenAIServing(state)
    runtime, metrics, config = state.runtime, state.metrics, state.config
    app.add_middleware(GuardMiddleware, config=config, drain=state.drain,  # type: ignore[arg-type]
                       max_body=max(MIN_BODY_LIMIT, 64 * runtime.context_len))
    if config.cors_allow_origins:
        app.add_middleware(CORSMiddleware,  # type: ignore[arg-type]
                           allow_origins=list(config.cors_allow_origins), allow_methods=["*"],
                           allow_headers=["*"])

    def reject(status: int, body: dict[str, Any]) -> JSONResponse:
        metrics.rejected.labels(state.model_name, str(status)).inc()
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return reject(exc.status, error_body(str(exc), type=exc.type, param=exc.param,
                                             code=exc.code or exc.status))

    @app.exception_handler(InvalidParam)
    async def _invalid_param(_: Request, exc: InvalidParam) -> JSONResponse:
        return reject(400, error_body(str(exc), param=exc.param, code="invalid_value"))

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, exc: ClientGone) -> Response:
        log.info("client disconnected; request %s aborted", exc)
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return reject(exc.status_code, error_body(str(exc.detail), type=kind,
                                                  code=exc.status_code))

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in a request")
        return reject(500, error_body(f"internal error: {type(exc).__name__}: {exc}",
                                      type="internal_error", code=500))

    # -------------------------------------------------------------- info

    @app.get("/health")
    async def health() -> Response:
        if state.watchdog is not None and state.watchdog.tripped:
            return reject(503, error_body("a model forward is stuck (--watchdog-timeout); the "
                                          "server is exiting", type="server_unavailable",
                                          code=503))
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        ids = runtime.tokenizer.encode("Hi") if runtime.tokenizer is not None else [1, 2]
        gen = Generation(state, [ids], [SamplingParams(max_new_tokens=1, temperature=0.0)],
                         request)
        try:
            states = await asyncio.wait_for(gen.collect(), timeout=60)
        except asyncio.TimeoutError:
            return reject(503, error_body("no token generated within 60 s",
                                          type="server_unavailable", code=503))
        if internal_failure(states):
            return reject(503, error_body(internal_failure(states) or "", type="internal_error",
                                          code=503))
        return Response(status_code=200)

    def model_card() -> dict[str, Any]:
        return {"id": state.model_name, "object": "model", "created": int(state.started),
                "owned_by": "engine", "root": state.model_path,
                "max_model_len": runtime.context_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> Any:
        if model != state.model_name:
            return reject(404, error_body(f"the model '{model}' does not exist",
                                          type="not_found_error", param="model",
                                          code="model_not_found"))
        return model_card()

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        mc = runtime.model_config
        return {"model_path": state.model_path, "served_model_name": state.model_name,
                "tokenizer_path": state.config.tokenizer_path or state.model_path,
                "is_generation": not state.config.is_embedding,
                "architectures": [mc.architecture],
                "model_type": mc.architecture, **runtime.info()}

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        stats = runtime.scheduler.stats()
        return {**state.config.to_json(), "version": engine.__version__,
                "scheduler": {**stats.__dict__, "kv_usage": stats.kv_usage},
                "runtime": runtime.info(), "uptime_s": time.time() - state.started}

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        done = runtime.scheduler.flush_cache()
        await asyncio.get_running_loop().run_in_executor(None, done.wait, 30)
        return PlainTextResponse("Cache flushed.\n")

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        """Token ids of a text (or of each text of a list), their count, and the context
        length; no model work."""
        body = parse_body(await request.body(), TokenizeRequest)
        tok = _tokenizer_for(runtime, "prompt", body.model, state.model_name)
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        ids = [tok.encode(t, add_special_tokens=body.add_special_tokens) for t in texts]
        one = isinstance(body.prompt, str)
        return {"tokens": ids[0] if one else ids,
                "count": len(ids[0]) if one else [len(i) for i in ids],
                "max_model_len": runtime.context_len}

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        """The text of a list of token ids (or of each list of a list)."""
        body = parse_body(await request.body(), DetokenizeRequest)
        tok = _tokenizer_for(runtime, "tokens", body.model, state.model_name)
        one = not body.tokens or isinstance(body.tokens[0], int)
        lists = [body.tokens] if one else body.tokens
        vocab = runtime.vocab_size
        for ids in lists:
            if any(t < 0 or t >= vocab for t in ids):  # type: ignore[operator]
                raise RequestError(f"token ids must be integers in [0, {vocab})",
                                   param="tokens")
        texts = [tok.decode(ids, skip_special_tokens=body.skip_special_tokens)
                 for ids in lists]
        return {"text": texts[0] if one else texts}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    # -------------------------------------------------------------- generation

    def generating(route: str) -> None:
        """Refuse a generation route on an embedding server (400, saying what it serves)."""
        if config.is_embedding:
            raise RequestError(f"this server serves embeddings (--is-embedding): {route} "
                               "generates text; use /v1/embeddings", code="wrong_endpoint")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        generating("/v1/completions")
        return await oai.completions(parse_body(await request.body(), CompletionRequest),
                                     request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        generating("/v1/chat/completions")
        return await oai.chat(parse_body(await request.body(), ChatCompletionRequest), request)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Any:
        generating("/generate")
        return await _native_generate(state, parse_body(await request.body(), GenerateRequest),
                                      request)

    @app.post("/v1/score")
    async def score(request: Request) -> Any:
        generating("/v1/score")
        return await oai.score(parse_body(await request.body(), ScoreRequest), request)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        if not config.is_embedding:
            raise RequestError("this server generates text: /v1/embeddings needs a server "
                               "started with --is-embedding", code="wrong_endpoint")
        return await oai.embeddings(parse_body(await request.body(), EmbeddingRequest), request)

    return app


def _tokenizer_for(runtime: Any, param: str, model: str | None, served: str) -> Any:
    """The server's tokenizer for ``/tokenize`` and ``/detokenize`` (a 404 for another
    ``model``, a 400 naming ``param`` without a tokenizer)."""
    if model is not None and model != served:
        raise RequestError(f"the model '{model}' does not exist; this server serves "
                           f"'{served}'", status=404, type="not_found_error", param="model",
                           code="model_not_found")
    if runtime.tokenizer is None:
        raise RequestError("this server runs with --skip-tokenizer-init: it has no tokenizer",
                           param=param)
    return runtime.tokenizer


async def _native_generate(state: ServerState, body: GenerateRequest, request: Request) -> Any:
    runtime = state.runtime
    if (body.text is None) == (body.input_ids is None):
        raise RequestError("give exactly one of 'text' or 'input_ids'",
                           param="text" if body.text is None else "input_ids")
    if body.text is not None:
        batched = isinstance(body.text, list)
        texts = body.text if isinstance(body.text, list) else [body.text]
        if runtime.tokenizer is None:
            raise RequestError("this server runs with --skip-tokenizer-init: give input_ids",
                               param="text")
        prompts = [runtime.tokenizer.encode(t) for t in texts]
        param = "text"
    else:
        ids = body.input_ids or []
        batched = bool(ids) and isinstance(ids[0], list)
        prompts = [list(p) for p in ids] if batched else [list(ids)]  # type: ignore[arg-type]
        param = "input_ids"
    if not prompts:
        raise RequestError(f"'{param}' is an empty batch", param=param)
    raw = body.sampling_params
    if isinstance(raw, list):
        if len(raw) != len(prompts):
            raise RequestError(f"{len(raw)} sampling_params for {len(prompts)} inputs",
                               param="sampling_params")
        raws = raw
    else:
        raws = [raw or {}] * len(prompts)
    chosen = body.custom_logit_processor
    if isinstance(chosen, list):
        if len(chosen) != len(prompts):
            raise RequestError(f"{len(chosen)} custom_logit_processor for {len(prompts)} inputs",
                               param="custom_logit_processor")
    else:
        chosen = [chosen] * len(prompts)
    picks = body.token_ids_logprob or []
    if picks and isinstance(picks[0], list):
        if len(picks) != len(prompts):
            raise RequestError(f"{len(picks)} token_ids_logprob lists for {len(prompts)} "
                               "inputs", param="token_ids_logprob")
    else:
        picks = [picks] * len(prompts)
    params, constraints, processors = [], [], []
    for r, proc, pick in zip(raws, chosen, picks):
        fields = dict(r)
        constraints.append(constraint({k: fields.pop(k, None)
                                       for k in GENERATE_CONSTRAINT_FIELDS}))
        processors.append(choose_processor(proc, fields.pop("custom_params", None),
                                           runtime.logit_processors, runtime.vocab_size))
        sp = to_sampling_params(fields, names={}, defaults=runtime.sampling_defaults)
        if body.return_logprob:
            sp.logprobs, sp.top_logprobs = True, body.top_logprobs_num
            sp.logprob_start_len = body.logprob_start_len
            sp.token_ids_logprob = list(pick)
        params.append(sp.validate())
    grammars = await grammar_matchers(state, constraints, params)
    gen = Generation(state, prompts, params, request, rid=body.rid, prompt_param=param,
                     max_tokens_param="max_new_tokens", priority=body.priority,
                     routing_key=body.routing_key, grammars=grammars,
                     logit_processors=processors)

    tok = runtime.tokenizer if body.return_text_in_logprobs else None

    def lp_entry(lp: float | None, t: int) -> list[Any]:
        """SGLang's [logprob, token id, token text] (text null unless
        ``return_text_in_logprobs``)."""
        return [lp, t, tok.decode([t]) if tok is not None else None]

    def item(s: SeqState, delta: Any = None) -> dict[str, Any]:
        """The response item of sequence ``s``: all of its text and ids, or only those of
        ``delta`` (``--incremental-streaming-output``)."""
        meta: dict[str, Any] = {
            "id": gen.rid if len(gen.seqs) == 1 else f"{gen.rid}-{s.index}",
            "finish_reason": s.finish_reason, "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens, "cached_tokens": s.cached_tokens,
            "cached_tokens_details": s.cached_tokens_details,
            "e2e_latency": time.monotonic() - gen.start}
        if gen.runtime.scheduler.spec is not None:
            meta["spec_verify_ct"] = s.spec_verify_ct
            meta["spec_accepted_tokens"] = s.spec_accepted_tokens
        if body.return_logprob:
            meta["output_token_logprobs"] = [lp_entry(lp, t) for lp, t in
                                             zip(s.logprobs, s.token_ids)]
            meta["output_top_logprobs"] = [[lp_entry(v, t) for t, v in top]
                                           for top in s.top_logprobs]
            if s.input_logprobs is not None and (delta is None or delta.input_logprobs):
                meta["input_token_logprobs"] = [lp_entry(lp, t) for lp, t in
                                                zip(s.input_logprobs, s.input_token_ids or [])]
                meta["input_top_logprobs"] = [[lp_entry(v, t) for t, v in top] or None
                                              for top in s.input_top_logprobs or []]
            picked = s.ids_logprobs if delta is None else delta.ids_logprobs
            if any(picked):
                meta["output_token_ids_logprobs"] = [[lp_entry(v, t) for t, v in pos]
                                                     for pos in picked]
            if s.input_ids_logprobs and any(s.input_ids_logprobs) and (
                    delta is None or delta.input_logprobs):
                meta["input_token_ids_logprobs"] = [[lp_entry(v, t) for t, v in pos] or None
                                                    for pos in s.input_ids_logprobs]
        text, ids = (delta.text, delta.token_ids) if delta is not None else (s.text, s.token_ids)
        out = {"text": text, "output_ids": list(ids), "meta_info": meta}
        if batched or len(gen.seqs) > 1:
            out["index"] = s.index
        return out

    if body.stream:
        async def events() -> AsyncIterator[str]:
            incremental = state.config.incremental_streaming_output
            async for s, out in gen:
                if out.token_ids or out.finished:
                    yield sse(item(s, out if incremental else None))
            yield sse("[DONE]")

        return sse_response(events())
    states = await gen.collect()
    failed = internal_failure(states)
    if failed:
        raise RequestError(failed, status=500, type="internal_error")
    items = [item(s) for s in states]
    return JSONResponse(items if batched or len(items) > 1 else items[0])


# ---------------------------------------------------------------------- start-up


class HeadDeadline:
    """Mixed into uvicorn's HTTP protocol: a connection that has not sent a whole request head
    (request line and headers) within ``head_timeout`` seconds of opening, or of its previous
    response, is closed. (uvicorn closes idle keep-alive connections, but not one that never
    sends a byte after connecting, nor one that trickles its head.)"""

    head_timeout: float
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(  # type: ignore[attr-defined]
            self.head_timeout, self._head_expired, self.cycle)  # type: ignore[attr-defined]

    def _head_expired(self, cycle: Any) -> None:
        """No request head has completed (no new request cycle) since the timer was set."""
        transport = self.transport  # type: ignore[attr-defined]
        if self.cycle is cycle and not transport.is_closing():  # type: ignore[attr-defined]
            transport.close()


#: how long a thread may hold the GIL while another waits for it (Python's default: 5 ms)
SWITCH_INTERVAL_ENV = "ENGINE_GIL_SWITCH_US"
DEFAULT_SWITCH_US = 500


def _set_switch_interval(runtime: Any) -> None:
    """The scheduler thread and the event loop share the GIL. When a GPU step's wait ends (the
    scheduler blocks in the sync for the sampled tokens with the GIL released), the scheduler
    asks for the GIL back and gets it only when the event loop's thread is forced to drop it:
    after the switch interval, 5 ms by default, while a step of a 64-request batch takes ~10 ms
    on the GPU. On a GPU 0.5 ms bounds that wait; on the CPU, where the forward itself keeps
    every core busy, Python's default stays (measured: no gain). ``ENGINE_GIL_SWITCH_US`` sets
    another value."""
    raw = os.environ.get(SWITCH_INTERVAL_ENV, "").strip()
    device = getattr(getattr(runtime, "runner", None), "device", None)
    if not raw and getattr(device, "type", "cpu") == "cpu":
        return
    try:
        us = int(raw) if raw else DEFAULT_SWITCH_US
    except ValueError:
        log.warning("%s=%r is not a number of microseconds; using %d", SWITCH_INTERVAL_ENV,
                    raw, DEFAULT_SWITCH_US)
        us = DEFAULT_SWITCH_US
    sys.setswitchinterval(max(us, 10) / 1e6)


def run_server(config: ServerConfig, assembly: Assembly) -> int:
    """Load the model, start the scheduler thread, warm up, serve until a signal.

    Logs one line when ready: the URL and the seconds from start to ready. The first SIGTERM or
    SIGINT drains the server (:meth:`~engine.server.state.Drain.run`, for up to
    ``--timeout-graceful-shutdown`` seconds), then it exits; a second one exits at once.
    """
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    t0 = time.monotonic()
    completion_template = None
    if config.completion_template is not None:
        completion_template = load_completion_template(config.completion_template)
    runtime = start_runtime(config, assembly)
    _set_switch_interval(runtime)
    if runtime.runner.device.type == "cuda":  # Triton builds from the warm-up on are counted
        from engine.runtime.kernel_builds import BUILDS

        BUILDS.install()
    watchdog = watch_forwards(runtime.runner, config.watchdog_timeout,
                              config.soft_watchdog_timeout)
    try:
        if not config.skip_server_warmup:
            with startup_phase(runtime.runner, "warm-up"):
                _warm_up(runtime)
        t_http = time.monotonic()
        name = _model_name(config, runtime)
        state = ServerState(config=config, runtime=runtime,
                            metrics=Metrics(runtime.scheduler.stats, name), model_name=name,
                            model_path=runtime.model_config.model_path, started=time.time(),
                            parsers=runtime.parsers, watchdog=watchdog,
                            completion_template=completion_template)
        app = create_app(state)
        url = f"http://{config.host}:{config.port}"

        class _Server(uvicorn.Server):
            exit_requested = False
            drain_task: asyncio.Task[None] | None = None

            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                if self.started:
                    now = time.monotonic()
                    phases = dict(getattr(runtime.runner, "startup_seconds", {}))
                    phases["http server"] = now - t_http
                    log.info("ready: serving %s at %s (%.1f s to ready; model loaded in "
                             "%.1f s)", state.model_name, url, now - t0, runtime.load_seconds)
                    log.info("start-up phases (s): %s", ", ".join(
                        f"{name} {sec:.3f}" for name, sec in phases.items()))
                    from engine.runtime.kernel_builds import BUILDS

                    if BUILDS.installed:
                        log.info("Triton kernel variants built in the warm-up: %d (a build "
                                 "after ready is logged as a warning)", BUILDS.mark_ready())
                    if not gc.isenabled():  # off for the start-up (engine.cli.serve)
                        gc.freeze()  # what start-up made lives as long as the server
                        gc.enable()

            def handle_exit(self, sig: int, frame: Any) -> None:
                """A signal handler: only flags (the drain starts at the next tick); a second
                signal is uvicorn's own exit, at once."""
                if self.exit_requested:
                    super().handle_exit(sig, frame)
                self.exit_requested = True

            async def on_tick(self, counter: int) -> bool:
                if self.exit_requested and self.drain_task is None:
                    self.drain_task = asyncio.create_task(
                        state.drain.run(config.timeout_graceful_shutdown))
                if self.drain_task is not None and self.drain_task.done():
                    self.should_exit = True
                return await super().on_tick(counter)

        protocol = type("HTTPProtocol", (HeadDeadline, AutoHTTPProtocol),
                        {"head_timeout": config.request_read_timeout})
        server = _Server(uvicorn.Config(
            app, host=config.host, port=config.port, http=protocol, log_level=config.log_level,
            access_log=config.log_level == "debug", timeout_keep_alive=config.timeout_keep_alive,
            limit_concurrency=config.limit_concurrency, timeout_graceful_shutdown=1))
        try:
            server.run()
        except SystemExit as exc:  # uvicorn exits when it cannot bind
            log.error("could not serve on %s", url)
            return int(exc.code or 1)
        return 0 if server.started else 1
    finally:
        watchdog.stop()
        runtime.shutdown()


def _warm_up(runtime: Runtime) -> None:
    """Short greedy generations through the scheduler thread (first-call costs paid here).

    On a GPU one prompt of each kind of token count Triton specialises a kernel on (1, a
    multiple of 16, any other) runs too, one after another, and one longer than an attention
    tile of query rows (129: short prompts take the extend kernel's split-prefix variant,
    longer ones the unsplit one, which an H200 run found built after ready): a JIT kernel
    compiled for each variant before /health turns ready is not compiled under the first
    requests' load."""
    import threading

    lengths = [4] if runtime.runner.device.type != "cuda" else [4, 1, 16, 17, 129]
    for n, length in enumerate(lengths):
        if length + 2 > runtime.scheduler.max_context_len:
            continue
        done = threading.Event()

        def sink(out: Any, done: threading.Event = done) -> None:
            if out.finished:
                done.set()

        # any ids, a different first one each (a cached prefix would shorten the prefill)
        ids = (runtime.tokenizer.encode("Hello") if runtime.tokenizer is not None and n == 0
               else [(n * 131 + k) % runtime.vocab_size for k in range(length)])
        reqs = runtime.make_reqs(f"warmup-{n}", ids,
                                 SamplingParams(max_new_tokens=2, temperature=0.0), sink)
        runtime.scheduler.submit(reqs)
        if not done.wait(timeout=300):
            log.warning("warm-up request did not finish within 300 s")
            return