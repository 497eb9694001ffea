"""The HTTP server: FastAPI routes over one :class:`~engine.runtime.frontend.Runtime`.

Routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (OpenAI), ``/generate``
(native), ``/health``, ``/health_generate``, ``/get_model_info``, ``/get_server_info``,
``/flush_cache``, ``/metrics``. With ``--api-key`` every route but ``/health`` needs
``Authorization: Bearer KEY``. Every error is ``{"error": {"message", "type", "param", "code"}}``
with a 4xx/5xx status; a bad request never disturbs the others.

The scheduler runs in its own thread; handlers only submit requests and await their outputs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import engine
from engine.config import ServerConfig
from engine.assembly import Assembly, ParserFactories
from engine.runtime.frontend import RequestError, Runtime, start_runtime
from engine.runtime.sampling import InvalidParam, SamplingParams
from engine.server.generation import Generation, SeqState, internal_failure
from engine.server.metrics import Metrics
from engine.server.openai_api import OpenAIServing, error_body, sse
from engine.server.protocol import (ChatCompletionRequest, CompletionRequest, GenerateRequest,
                                    to_sampling_params)

log = logging.getLogger("engine.serve")

MIN_BODY_LIMIT = 8 * 2**20  #: bytes; raised for long contexts (about 64 bytes per token)


@dataclass
class ServerState:
    config: ServerConfig
    runtime: Runtime
    metrics: Metrics
    model_name: str
    model_path: str
    started: float
    parsers: ParserFactories  #: the chat parsers' factories, built once at start-up


def _model_name(config: ServerConfig, runtime: Runtime) -> str:
    if config.served_model_name:
        return config.served_model_name
    mc = runtime.model_config
    path = mc.gguf_file or mc.model_path
    base = os.path.basename(os.path.normpath(path))
    return base[:-5] if base.endswith(".gguf") else base


# ---------------------------------------------------------------------- ASGI middleware


def _json_error(status: int, message: str, *, type: str, param: str | None = None,
                code: Any = None) -> JSONResponse:
    return JSONResponse(error_body(message, type=type, param=param, code=code or status),
                        status_code=status)


class GuardMiddleware:
    """API-key check (all routes but ``/health``) and the request-body size limit (413)."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int) -> None:
        self.app, self.api_key, self.max_body = app, api_key, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope.get("path") != "/health":
            auth = headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key")
            if token != self.api_key:
                resp = _json_error(401, "missing or invalid API key (send 'Authorization: "
                                   "Bearer KEY')", type="authentication_error",
                                   code="invalid_api_key")
                await resp(scope, receive, send)
                return
        if scope.get("method") in ("POST", "PUT") and "json" not in headers.get("content-type",
                                                                               ""):
            # every body here is JSON: read it as such whatever the client labelled it
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope.get("headers", [])
                                if k.lower() != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await self._too_large(scope, receive, send)
            return
        if length is None and scope.get("method") in ("POST", "PUT"):
            body, more, total = [], True, 0
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                chunk = msg.get("body", b"")
                total += len(chunk)
                if total > self.max_body:
                    await self._too_large(scope, receive, send)
                    return
                body.append(chunk)
                more = msg.get("more_body", False)
            replay: list[Message] = [{"type": "http.request", "body": b"".join(body),
                                      "more_body": False}]

            async def receive_again() -> Message:
                return replay.pop() if replay else await receive()

            await self.app(scope, receive_again, send)
            return
        await self.app(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        resp = _json_error(413, f"request body larger than {self.max_body} bytes",
                           type="invalid_request_error", code="request_too_large")
        await resp(scope, receive, send)


# ---------------------------------------------------------------------- the app


def create_app(state: ServerState) -> FastAPI:
    """The FastAPI app over a started runtime (its scheduler thread already running)."""
    app = FastAPI(title="engine", version=engine.__version__, docs_url=None, redoc_url=None)
    app.state.server = state
    oai = OpenAIServing(state)
    runtime, metrics = state.runtime, state.metrics
    app.add_middleware(GuardMiddleware, api_key=state.config.api_key,  # type: ignore[arg-type]
                       max_body=max(MIN_BODY_LIMIT, 64 * runtime.context_len))

    def reject(status: int, body: dict[str, Any]) -> JSONResponse:
        metrics.rejected.labels(state.model_name, str(status)).inc()
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = (exc.errors() or [{}])[0]
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            msg = f"the request body is not valid JSON: {err.get('ctx', {}).get('error', '')}"
            return reject(400, error_body(msg.rstrip(": "), code="invalid_json"))
        param = ".".join(loc) or None
        if err.get("type") == "missing":
            msg = f"missing required field '{param}'"
        elif err.get("type") == "model_attributes_type":
            msg = "the request body must be a JSON object"
        else:
            msg = f"{param}: {err.get('msg', 'invalid value')}" if param else str(err.get("msg"))
        return reject(400, error_body(msg, param=param.split(".")[0] if param else None,
                                      code="invalid_value"))

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return reject(exc.status, error_body(str(exc), type=exc.type, param=exc.param,
                                             code=exc.code or exc.status))

    @app.exception_handler(InvalidParam)
    async def _invalid_param(_: Request, exc: InvalidParam) -> JSONResponse:
        return reject(400, error_body(str(exc), param=exc.param, code="invalid_value"))

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
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        ids = runtime.tokenizer.encode("Hi")
        gen = Generation(runtime, metrics, [ids], [SamplingParams(max_new_tokens=1,
                                                                  temperature=0.0)], request)
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
                "is_generation": True, "architectures": [mc.architecture],
                "model_type": mc.architecture, **runtime.info()}

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        stats = runtime.scheduler.stats()
        return {**state.config.to_json(), "version": engine.__version__,
                "scheduler": {**stats.__dict__, "kv_usage": stats.kv_usage},
                "runtime": runtime.info(), "uptime_s": time.time() - state.started}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        done = runtime.scheduler.flush_cache()
        await asyncio.get_running_loop().run_in_executor(None, done.wait, 30)
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    # -------------------------------------------------------------- generation

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await oai.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        return await oai.chat(body, request)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(body: GenerateRequest, request: Request) -> Any:
        return await _native_generate(state, body, request)

    return app


async def _native_generate(state: ServerState, body: GenerateRequest, request: Request) -> Any:
    runtime = state.runtime
    if (body.text is None) == (body.input_ids is None):
        raise RequestError("give exactly one of 'text' or 'input_ids'",
                           param="text" if body.text is None else "input_ids")
    if body.text is not None:
        batched = isinstance(body.text, list)
        texts = body.text if isinstance(body.text, list) else [body.text]
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
    params = []
    for r in raws:
        sp = to_sampling_params(dict(r), api_names=False)
        if body.return_logprob:
            sp.logprobs, sp.top_logprobs = True, body.top_logprobs_num
        params.append(sp.validate())
    gen = Generation(runtime, state.metrics, prompts, params, request, rid=body.rid,
                     prompt_param=param, max_tokens_param="max_new_tokens")

    def item(s: SeqState) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": gen.rid if len(gen.seqs) == 1 else f"{gen.rid}-{s.index}",
            "finish_reason": s.finish_reason, "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens, "cached_tokens": s.cached_tokens,
            "e2e_latency": time.monotonic() - gen.start}
        if body.return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in
                                             zip(s.logprobs, s.token_ids)]
            meta["output_top_logprobs"] = [[[v, t, None] for t, v in top]
                                           for top in s.top_logprobs]
        out = {"text": s.text, "output_ids": list(s.token_ids), "meta_info": meta}
        if batched or len(gen.seqs) > 1:
            out["index"] = s.index
        return out

    if body.stream:
        async def events() -> AsyncIterator[str]:
            async for s, out in gen:
                if out.token_ids or out.finished:
                    yield sse(item(s))
            yield sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")
    states = await gen.collect()
    failed = internal_failure(states)
    if failed:
        raise RequestError(failed, status=500, type="internal_error")
    items = [item(s) for s in states]
    return JSONResponse(items if batched or len(items) > 1 else items[0])


# ---------------------------------------------------------------------- start-up


def run_server(config: ServerConfig, assembly: Assembly) -> int:
    """Load the model, start the scheduler thread, warm up, serve until interrupted.

    Logs one line when ready: the URL and the seconds from start to ready.
    """
    import uvicorn

    t0 = time.monotonic()
    runtime = start_runtime(config, assembly)
    try:
        if not config.skip_server_warmup:
            _warm_up(runtime)
        name = _model_name(config, runtime)
        state = ServerState(config=config, runtime=runtime,
                            metrics=Metrics(runtime.scheduler.stats, name), model_name=name,
                            model_path=runtime.model_config.model_path, started=time.time(),
                            parsers=runtime.parsers)
        app = create_app(state)
        url = f"http://{config.host}:{config.port}"

        class _Server(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                if self.started:
                    log.info("ready: serving %s at %s (%.1f s to ready; model loaded in "
                             "%.1f s)", state.model_name, url, time.monotonic() - t0,
                             runtime.load_seconds)

        server = _Server(uvicorn.Config(app, host=config.host, port=config.port,
                                        log_level=config.log_level, access_log=(
                                            config.log_level == "debug"),
                                        timeout_graceful_shutdown=5))
        try:
            server.run()
        except SystemExit as exc:  # uvicorn exits when it cannot bind
            log.error("could not serve on %s", url)
            return int(exc.code or 1)
        return 0 if server.started else 1
    finally:
        runtime.shutdown()


def _warm_up(runtime: Runtime) -> None:
    """One short greedy generation through the scheduler thread (first-call costs paid here)."""
    import threading

    done = threading.Event()

    def sink(out: Any) -> None:
        if out.finished:
            done.set()

    ids = runtime.tokenizer.encode("Hello")
    reqs = runtime.make_reqs("warmup", ids, SamplingParams(max_new_tokens=2, temperature=0.0),
                             sink)
    runtime.scheduler.submit(reqs)
    if not done.wait(timeout=300):
        log.warning("warm-up request did not finish within 300 s")

