"""``/v1/completions`` and ``/v1/chat/completions``: OpenAI request -> runtime -> OpenAI response.

Chat responses pass the generated text through the parser pipeline
(:mod:`engine.parsers.api`) when ``--reasoning-parser`` is set, or ``--tool-call-parser`` is set
and the request has ``tools`` (and ``tool_choice`` is not ``none``); otherwise the text is the
message content as is. That is the one seam where reasoning and tool calls are split out:
:func:`chat_message` builds a whole message, :class:`ChatDeltas` the streamed deltas of the
same message (their concatenation equals it, tool-call ids aside).
"""

from __future__ import annotations

import base64
import json
import struct
import logging
import time
from typing import Any, AsyncIterator

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from engine.api.grammar import GrammarSpec
from engine.assembly import ParserFactories
from engine.parsers.api import MessageStream, call_constraint, parse_message
from engine.runtime.frontend import RequestError
from engine.runtime.grammar import GrammarUnavailable
from engine.runtime.logit_processors import choose as choose_processor
from engine.server.generation import (ClientGone, Generation, SeqState, grammar_matchers,
                                      internal_failure, usage)
from engine.runtime.sampling import InvalidParam, SamplingParams
from engine.server.protocol import (API_NAMES, CONSTRAINT_FIELDS, ChatCompletionRequest,
                                    CompletionRequest, EmbeddingRequest, ScoreRequest,
                                    constraint, to_sampling_params)

log = logging.getLogger("engine.serve")

#: arguments of the template rendering call that the server sets, not ``chat_template_kwargs``
RENDER_ARGUMENTS = frozenset({"messages", "conversation", "tools", "tokenize",
                              "add_generation_prompt", "continue_final_message", "documents",
                              "return_dict", "return_tensors", "chat_template"})

FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    """A server-sent-events response of ``events`` that always ends well: a generation the
    server ends early (a :class:`RequestError`, e.g. at shutdown) sends an error event and
    ``[DONE]``; a client that left gets nothing more, and that is logged as such."""
    async def guarded() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        except RequestError as exc:
            yield sse(error_body(str(exc), type=exc.type, param=exc.param,
                                 code=exc.code or exc.status))
            yield sse("[DONE]")
        except ClientGone as exc:
            log.info("client disconnected; request %s aborted", exc)

    return StreamingResponse(guarded(), media_type="text/event-stream")


def finish_reason(state: SeqState) -> str | None:
    if state.finish_reason is None:
        return None
    return FINISH.get(state.finish_reason.get("type", ""), "stop")


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class OpenAIServing:
    """The two OpenAI generation endpoints over one server state (runtime, metrics, names)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.tok = state.runtime.tokenizer

    # ------------------------------------------------------------------ helpers

    def _usage(self, states: list[SeqState]) -> dict[str, Any]:
        return usage(states, cache_report=self.state.config.enable_cache_report)

    def _processor(self, body: Any) -> Any:
        """The request's custom logit processor (``custom_logit_processor``), or None."""
        runtime = self.state.runtime
        return choose_processor(body.custom_logit_processor, body.custom_params,
                                runtime.logit_processors, runtime.vocab_size)

    def _token_text(self, tid: int) -> str:
        return self.tok.decode([tid])

    def _check_model(self, model: str | None) -> str:
        name = self.state.model_name
        if model is not None and model not in (name, self.state.model_path):
            raise RequestError(f"the model '{model}' does not exist; this server serves "
                               f"'{name}'", param="model", status=404, code="model_not_found")
        return name

    # ------------------------------------------------------------------ completions

    def _need_tokenizer(self, param: str) -> None:
        if self.tok is None:
            raise RequestError("this server runs with --skip-tokenizer-init: the OpenAI text "
                               "endpoints need a tokenizer; use /generate with input_ids",
                               param=param)

    async def completions(self, body: CompletionRequest, request: Request) -> Any:
        model = self._check_model(body.model)
        self._need_tokenizer("prompt")
        prompt = body.prompt
        if isinstance(prompt, str):
            prompts: list[str | list[int]] = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            prompts = [list(prompt)]  # type: ignore[arg-type]
        else:
            prompts = list(prompt)  # type: ignore[arg-type]
        if not prompts:
            raise RequestError("prompt must not be empty", param="prompt")
        if body.suffix:
            prompts = self._fill_in_the_middle(prompts, body.suffix)
        ids = [self.tok.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        data = body.sampling_dict()
        if body.logprobs is not None:
            data.update(logprobs=True, top_logprobs=body.logprobs)
            if body.echo:  # the echoed prompt's tokens are scored too (as evaluation asks)
                data["logprob_start_len"] = 0
        sp = to_sampling_params(data, defaults=self.state.runtime.sampling_defaults)
        found = constraint(body.model_dump(include=set(CONSTRAINT_FIELDS)), body.response_format)
        processor = self._processor(body)
        grammars = await grammar_matchers(self.state, [found] * len(ids), [sp] * len(ids))
        gen = Generation(self.state, ids, [sp] * len(ids), request, rid=body.rid,
                         priority=body.priority, routing_key=body.routing_key,
                         grammars=grammars, logit_processors=[processor] * len(ids))
        echo = [self.tok.decode(i) if body.echo else "" for i in ids]
        cid, created = f"cmpl-{gen.rid}", int(time.time())
        if body.stream:
            return sse_response(self._stream_completions(gen, body, model, cid, created, echo))
        states = await gen.collect()
        failed = internal_failure(states)
        if failed:
            raise RequestError(failed, status=500, type="internal_error")
        choices = [{"index": s.index, "text": echo[s.prompt_index] + s.text,
                    "logprobs": self._completion_logprobs(s, echo=echo[s.prompt_index])
                    if sp.logprobs else None,
                    "finish_reason": finish_reason(s),
                    "matched_stop": (s.finish_reason or {}).get("matched")} for s in states]
        return JSONResponse({"id": cid, "object": "text_completion", "created": created,
                             "model": model, "choices": choices, "usage": self._usage(states)})

    def _fill_in_the_middle(self, prompts: list[str | list[int]],
                            suffix: str) -> list[str | list[int]]:
        """Each text prompt joined with ``suffix`` by ``--completion-template``."""
        template = self.state.completion_template
        if template is None:
            raise RequestError("suffix needs a fill-in-the-middle template: this server runs "
                               "without --completion-template", param="suffix")
        if not all(isinstance(p, str) for p in prompts):
            raise RequestError("suffix needs a text prompt (the template joins text), not "
                               "token ids", param="suffix")
        return [template.format(p, suffix) for p in prompts]  # type: ignore[arg-type]

    def _completion_logprobs(self, s: SeqState, start: int = 0, echo: str = "",
                             with_prompt: bool = True, done: int = 0) -> dict[str, Any]:
        """OpenAI's ``logprobs`` of the generated tokens from ``start`` on; ``echo``: the
        prompt's text that the choice's text begins with, preceded (``with_prompt``) by the
        prompt's own tokens, scored (the first one null). ``text_offset`` counts characters
        from the start of the choice's text; ``done``: the characters of the generated tokens
        before ``start`` (a stream keeps the count, so no event decodes the earlier tokens
        again)."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []

        def add(ids, lps, alts, pos: int) -> None:  # (a null value has no alternatives)
            for t, lp, top in zip(ids, lps, alts):
                text = self._token_text(t)
                tokens.append(text)
                values.append(lp)
                tops.append({self._token_text(a): v for a, v in top} if lp is not None
                            else None)
                offsets.append(pos)
                pos += len(text)

        if echo and with_prompt and s.input_logprobs is not None:
            add(s.input_token_ids or [], s.input_logprobs, s.input_top_logprobs or [], 0)
        add(s.token_ids[start:], s.logprobs[start:], s.top_logprobs[start:], len(echo) + done)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}

    async def _stream_completions(self, gen: Generation, body: CompletionRequest, model: str,
                                  cid: str, created: int, echo: list[str]) -> AsyncIterator[str]:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        head = {"id": cid, "object": "text_completion", "created": created, "model": model}
        sent_echo: set[int] = set()
        done: dict[int, int] = {}  # characters of each choice's tokens already reported
        async for s, out in gen:
            text = out.text
            first = bool(echo[s.prompt_index]) and s.index not in sent_echo
            if first:
                sent_echo.add(s.index)
                text = echo[s.prompt_index] + text
            if not text and not out.finished and not out.logprobs:
                continue
            lp = None
            if out.logprobs or (first and out.input_logprobs is not None):
                n = len(out.token_ids)
                lp = self._completion_logprobs(s, len(s.token_ids) - n, echo[s.prompt_index],
                                               with_prompt=first, done=done.get(s.index, 0))
                done[s.index] = done.get(s.index, 0) + sum(
                    len(t) for t in lp["tokens"][len(lp["tokens"]) - n:])
            choice = {"index": s.index, "text": text, "logprobs": lp,
                      "finish_reason": finish_reason(s) if out.finished else None}
            if out.finished and internal_failure([s]):
                yield sse(error_body(internal_failure([s]) or "", type="internal_error"))
                continue
            yield sse({**head, "choices": [choice]})
        if include_usage:
            yield sse({**head, "choices": [], "usage": self._usage(gen.states)})
        yield sse("[DONE]")

    # ------------------------------------------------------------------ scoring

    async def score(self, body: ScoreRequest, request: Request) -> Any:
        """Per item, the probabilities of ``label_token_ids`` as the next token after the
        query joined with the item (text joined as text, then tokenized; ids joined as ids):
        the labels' own probabilities, or with ``apply_softmax`` renormalized over the labels.
        One prefill per item; the token it draws is dropped."""
        model = self._check_model(body.model)
        items = [body.items] if isinstance(body.items, str) else list(body.items)
        if not items:
            raise RequestError("items must not be empty", param="items")
        texts = isinstance(body.query, str)
        if any(isinstance(i, str) != texts for i in items):
            raise RequestError("query and items must all be text or all be token ids",
                               param="items")
        if texts:
            self._need_tokenizer("query")
            joined = [i + body.query if body.item_first else body.query + i for i in items]
            prompts = [self.tok.encode(t) for t in joined]  # type: ignore[operator]
        else:
            prompts = [list(i) + list(body.query) if body.item_first  # type: ignore[arg-type]
                       else list(body.query) + list(i) for i in items]  # type: ignore[arg-type]
        sp = SamplingParams(max_new_tokens=1, temperature=0.0, logprobs=True,
                            token_ids_logprob=list(body.label_token_ids))
        try:
            sp.validate(self.state.runtime.vocab_size)
        except InvalidParam as exc:
            raise RequestError(str(exc).replace("token_ids_logprob", "label_token_ids"),
                               param="label_token_ids") from None
        gen = Generation(self.state, prompts, [sp] * len(prompts), request, rid=body.rid,
                         prompt_param="items", priority=body.priority)
        states = await gen.collect()
        failed = internal_failure(states)
        if failed:
            raise RequestError(failed, status=500, type="internal_error")
        scores = []
        for s in sorted(states, key=lambda st: st.prompt_index):
            lp = torch.tensor([v for _, v in s.ids_logprobs[0]], dtype=torch.float64)
            scores.append((torch.softmax(lp, 0) if body.apply_softmax else lp.exp()).tolist())
        prompt_tokens = sum(s.prompt_tokens for s in states)
        return JSONResponse({"scores": scores, "model": model, "object": "scoring",
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                                       "total_tokens": prompt_tokens}})

    # ------------------------------------------------------------------ embeddings

    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Any:
        """One embedding per input (``--is-embedding``): the model's final hidden state at the
        input's last token, L2-normalized; ``base64`` is its little-endian float32 bytes."""
        model = self._check_model(body.model)
        size = self.state.runtime.model_config.hidden_size
        if body.dimensions is not None and body.dimensions != size:
            raise RequestError(f"dimensions {body.dimensions}: this model's embeddings have "
                               f"{size} dimensions and cannot be shortened (it is not a "
                               "matryoshka model); leave dimensions out", param="dimensions")
        ids = [self._embedding_input(p, i) for i, p in enumerate(_embedding_inputs(body.input))]
        params = [SamplingParams(max_new_tokens=0, temperature=0.0) for _ in ids]
        gen = Generation(self.state, ids, params, request, rid=body.rid, prompt_param="input",
                         priority=body.priority)
        states = await gen.collect()
        failed = internal_failure(states)
        if failed:
            raise RequestError(failed, status=500, type="internal_error")
        data = []
        for s in states:
            vector = s.embedding or []
            if body.encoding_format == "base64":
                packed = struct.pack(f"<{len(vector)}f", *vector)
                value: Any = base64.b64encode(packed).decode("ascii")
            else:
                value = vector
            data.append({"object": "embedding", "index": s.index, "embedding": value})
        prompt = sum(s.prompt_tokens for s in states)
        return JSONResponse({"object": "list", "data": data, "model": model,
                             "usage": {"prompt_tokens": prompt, "total_tokens": prompt}})

    def _embedding_input(self, item: str | list[int], index: int) -> list[int]:
        where = "input" if index == 0 else f"input[{index}]"
        if isinstance(item, str):
            if not item:
                raise RequestError(f"{where} is an empty string", param="input")
            if self.tok is None:
                raise RequestError("this server has no tokenizer (--skip-tokenizer-init); "
                                   "give input as token ids", param="input")
            return self.tok.encode(item)
        if not item:
            raise RequestError(f"{where} is an empty list of token ids", param="input")
        return list(item)

    # ------------------------------------------------------------------ chat

    def _chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        self._need_tokenizer("messages")
        messages = template_messages(body)
        kwargs = dict(body.chat_template_kwargs or {})
        reserved = sorted(set(kwargs) & RENDER_ARGUMENTS)
        if reserved:
            raise RequestError(f"chat_template_kwargs may not set {', '.join(reserved)}: the "
                               "server sets these itself (use the request's own fields)",
                               param="chat_template_kwargs")
        if body.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", body.reasoning_effort)
        if body.continue_final_message:
            kwargs["continue_final_message"] = True
        tools = body.tools if body.tools and body.tool_choice != "none" else None
        try:
            add_prompt = body.add_generation_prompt and not body.continue_final_message
            ids = self.tok.apply_chat_template(messages, tools=tools,
                                               add_generation_prompt=add_prompt, **kwargs)
        except Exception as exc:  # noqa: BLE001 - template errors are the request's fault
            raise RequestError(f"the chat template failed on these messages: {exc}",
                               param="messages") from None
        return list(ids)  # type: ignore[arg-type]

    def _check_tools(self, body: ChatCompletionRequest) -> str | None:
        """Validate ``tools`` (at most ``--max-tools``; ``parameters``, when given, a JSON
        schema object) and ``tool_choice``; return the forced tool name, if any."""
        choice = body.tool_choice
        tools = body.tools or []
        limit = self.state.config.max_tools
        if len(tools) > limit:
            raise RequestError(f"{len(tools)} tools; this server takes at most {limit} "
                               "(--max-tools)", param="tools")
        names = []
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if tool.get("type", "function") != "function" or not isinstance(fn, dict) or \
                    not isinstance(fn.get("name"), str):
                raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': "
                                   "{'name': ..., 'parameters': ...}}", param="tools")
            if not isinstance(fn.get("parameters", {}), dict):
                raise RequestError(f"tools[{i}].function.parameters must be a JSON schema "
                                   "(an object)", param="tools")
            names.append(fn["name"])
        if choice is None or choice in ("none", "auto"):
            return None
        if isinstance(choice, str) and choice != "required":
            raise RequestError(f"tool_choice must be 'none', 'auto', 'required' or a named "
                               f"function, got {choice!r}", param="tool_choice")
        if not names:
            raise RequestError("tool_choice needs tools", param="tool_choice")
        if self.state.parsers.tool is None:
            raise RequestError("tool_choice 'required' or a named function needs the server "
                               "to run with --tool-call-parser", param="tool_choice")
        if choice == "required":
            return ""
        fn = choice.get("function") if isinstance(choice, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise RequestError("a named tool_choice is {'type': 'function', 'function': "
                               "{'name': ...}}", param="tool_choice")
        if name not in names:
            raise RequestError(f"tool_choice names '{name}', which is not among the tools",
                               param="tool_choice")
        return name

    def _call_constraint(self, body: ChatCompletionRequest,
                         forced: str) -> tuple[GrammarSpec, str] | None:
        """The constraint that makes the output the forced call(s) in the tool parser's format,
        after the reasoning section when a reasoning parser is on (the reasoning parser says
        where it ends); None where the choice is checked after generation instead: the tool
        parser gives no constraint, the grammar backend compiles none, or the reasoning parser
        cannot say where its section ends."""
        grammars, parsers = self.state.runtime.grammars, self.state.parsers
        if grammars is None or parsers.tool is None:
            return None
        try:
            kinds = grammars.backend.kinds  # built already: chat() awaited loaded()
        except GrammarUnavailable:
            return None
        if "tool_calls" not in kinds:
            return None
        reasoning = None
        if parsers.reasoning is not None:
            reasoning = parsers.reasoning(
                chat_template_kwargs=dict(body.chat_template_kwargs or {}),
                reasoning_effort=body.reasoning_effort)
        spec = call_constraint(parsers.tool(tools=body.tools), reasoning, forced,
                               body.parallel_tool_calls)
        if spec is None:
            return None
        return spec, "tool_choice"

    def _chat_logprobs(self, s: SeqState, start: int = 0) -> dict[str, Any]:
        def entry(tid: int, lp: float) -> dict[str, Any]:
            text = self._token_text(tid)
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

        content = []
        for tid, lp, top in zip(s.token_ids[start:], s.logprobs[start:], s.top_logprobs[start:]):
            content.append({**entry(tid, lp), "top_logprobs": [entry(t, v) for t, v in top]})
        return {"content": content}

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Any:
        model = self._check_model(body.model)
        forced = self._check_tools(body)
        if body.top_logprobs and not body.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        ids = self._chat_prompt(body)
        data = body.sampling_dict()
        names = dict(API_NAMES)
        if body.max_completion_tokens is not None:
            data["max_new_tokens"] = body.max_completion_tokens
            names["max_new_tokens"] = "max_completion_tokens"
        data.update(logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0)
        sp = to_sampling_params(data, names=names, defaults=self.state.runtime.sampling_defaults)
        found = constraint(body.model_dump(include=set(CONSTRAINT_FIELDS)), body.response_format)
        if forced is not None:
            if self.state.runtime.grammars is not None:
                try:  # the backend is built on first use: off the event loop
                    await self.state.runtime.grammars.loaded()
                except GrammarUnavailable:
                    pass  # no constraint: the forced call is checked after generation
            calls = self._call_constraint(body, forced)
            if calls is not None and found is not None:
                raise RequestError(f"a request takes at most one constraint; this one has "
                                   f"{found[1]} and a tool_choice that forces a call",
                                   param="tool_choice")
            found = found or calls
        processor = self._processor(body)
        grammars = await grammar_matchers(self.state, [found], [sp])
        gen = Generation(self.state, [ids], [sp], request, rid=body.rid,
                         prompt_param="messages", max_tokens_param=names["max_new_tokens"],
                         priority=body.priority, routing_key=body.routing_key,
                         grammars=grammars, logit_processors=[processor])
        pkw = parser_kwargs(body, self.state.parsers)
        cid, created = f"chatcmpl-{gen.rid}", int(time.time())
        if body.stream:
            return sse_response(self._stream_chat(gen, body, model, cid, created, pkw, forced))
        states = await gen.collect()
        failed = internal_failure(states)
        if failed:
            raise RequestError(failed, status=500, type="internal_error")
        choices = []
        for s in states:
            message, reason = chat_message(s.text, finish_reason(s), pkw, forced)
            choices.append({"index": s.index, "message": message,
                            "logprobs": self._chat_logprobs(s) if sp.logprobs else None,
                            "finish_reason": reason,
                            "matched_stop": (s.finish_reason or {}).get("matched")})
        return JSONResponse({"id": cid, "object": "chat.completion", "created": created,
                             "model": model, "choices": choices, "usage": self._usage(states)})

    async def _stream_chat(self, gen: Generation, body: ChatCompletionRequest, model: str,
                           cid: str, created: int, pkw: dict[str, Any] | None,
                           forced: str | None) -> AsyncIterator[str]:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        head = {"id": cid, "object": "chat.completion.chunk", "created": created,
                "model": model}
        choices: dict[int, ChatDeltas] = {}

        def chunk(index: int, delta: dict[str, Any], reason: str | None = None,
                  logprobs: Any = None) -> str:
            return sse({**head, "choices": [{"index": index, "delta": delta,
                                             "logprobs": logprobs, "finish_reason": reason}]})

        for s in gen.states:
            yield chunk(s.index, {"role": "assistant", "content": ""})
            choices[s.index] = ChatDeltas(pkw, forced)
        async for s, out in gen:
            lp = None
            if out.logprobs:
                lp = self._chat_logprobs(s, len(s.token_ids) - len(out.token_ids))
            choice = choices[s.index]
            deltas = choice.feed(out.text, finished=out.finished)
            for i, d in enumerate(deltas):
                yield chunk(s.index, d, logprobs=lp if i == 0 else None)
            if lp is not None and not deltas:
                yield chunk(s.index, {}, logprobs=lp)
            if out.finished:
                failed = internal_failure([s])
                if failed:
                    yield sse(error_body(failed, type="internal_error"))
                    continue
                reason, error = choice.close(finish_reason(s))
                if error is not None:
                    yield sse(error)
                yield chunk(s.index, {}, reason)
        if include_usage:
            yield sse({**head, "choices": [], "usage": self._usage(gen.states)})
        yield sse("[DONE]")


def _embedding_inputs(value: str | list[Any]) -> list[str | list[int]]:
    """``input`` as a list of texts or token-id lists: a text and a token-id list are one
    input each; a list of texts or of token-id lists is a batch."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise RequestError("input is an empty list", param="input")
    if all(isinstance(v, int) for v in value):
        return [list(value)]
    return list(value)


def _no_call_message(forced: str) -> str:
    if forced:
        return f"tool_choice names '{forced}', but the model produced no valid call to it"
    return "tool_choice is 'required', but the model produced no valid tool call"


def _forced_calls(calls: list[dict[str, Any]], forced: str | None) -> list[dict[str, Any]]:
    """Keep only calls to the named tool when one is forced; raise when a call is required
    (``forced`` is ``""``) or named but none was produced."""
    if forced:
        calls = [c for c in calls if c["function"]["name"] == forced]
    if forced is not None and not calls:
        raise RequestError(_no_call_message(forced), param="tool_choice",
                           code="tool_call_missing")
    return calls


# ---------------------------------------------------------------------- chat messages


def template_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The request's messages as the chat template receives them.

    Text parts of a list ``content`` are joined (other parts are refused); a missing or null
    ``content`` (an assistant turn that only calls tools) becomes ``""``, which every template
    can concatenate; ``tool_calls[].function.arguments`` given as a JSON text (as OpenAI clients
    send it back) becomes the mapping that templates iterate or re-serialize. ``tool`` messages
    and ``tool_call_id`` pass through unchanged; what the template makes of them is its own
    business (SmolLM2's renders a ``tool`` turn like any other and ignores ``tool_calls``).
    """
    messages = []
    for m in body.messages:
        msg = m.model_dump(exclude_none=True)
        if isinstance(m.content, list):
            parts = []
            for part in m.content:
                if part.get("type") != "text":
                    raise RequestError(f"message content of type {part.get('type')!r} is "
                                       "not supported (text only)", param="messages")
                parts.append(str(part.get("text", "")))
            msg["content"] = "".join(parts)
        msg.setdefault("content", "")
        for call in msg.get("tool_calls") or ():
            fn = call.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except json.JSONDecodeError:
                    pass
        messages.append(msg)
    return messages


def parser_kwargs(body: ChatCompletionRequest, parsers: ParserFactories) -> dict[str, Any] | None:
    """Arguments of the parser pipeline for one request, or None when the text is returned as
    is (no reasoning parser, and no tool parser in use: no ``tools``, or ``tool_choice`` is
    ``none``). ``parsers`` are the server's factories, built once at start-up; the request's
    ``chat_template_kwargs`` and ``reasoning_effort`` decide whether reasoning is on (fact
    sheet §0.2); with ``continue_final_message`` the final assistant message is the prefill the
    parsers read first (:func:`prefill_text`)."""
    use_tools = bool(parsers.tool and body.tools and body.tool_choice != "none")
    if parsers.reasoning is None and not use_tools:
        return None
    return {"reasoning_parser": parsers.reasoning,
            "tool_parser": parsers.tool if use_tools else None,
            "tools": body.tools if use_tools else None,
            "chat_template_kwargs": body.chat_template_kwargs,
            "reasoning_effort": body.reasoning_effort,
            "separate_reasoning": body.separate_reasoning,
            "prefill": prefill_text(body)}


def prefill_text(body: ChatCompletionRequest) -> str | None:
    """With ``continue_final_message``, the text of the final assistant message that the
    output continues: the parsers start in the state it leaves them in (a prefill
    ``<think>work</think>The answer is `` makes the continuation content, not reasoning)."""
    if not body.continue_final_message or not body.messages:
        return None
    last = body.messages[-1]
    if last.role != "assistant":
        return None
    if isinstance(last.content, list):
        return "".join(str(p.get("text", "")) for p in last.content
                       if isinstance(p, dict) and p.get("type") == "text") or None
    return last.content or None


def chat_message(text: str, reason: str | None, pkw: dict[str, Any] | None,
                 forced: str | None) -> tuple[dict[str, Any], str | None]:
    """The non-streamed assistant message of one choice and its finish reason.

    Without a pipeline (``pkw`` None) the text is the content. Otherwise ``content`` holds the
    normal text only (None when empty), ``reasoning_content`` the reasoning (None when there is
    none), and ``tool_calls`` (present only when there are calls) the parsed calls; a ``stop``
    becomes ``tool_calls`` when there are calls. ``forced`` as :class:`ChatDeltas`: a missing
    required call raises :class:`RequestError` (400, ``param: tool_choice``).
    """
    if pkw is None:
        return {"role": "assistant", "content": text}, reason
    parsed = parse_message(text, **pkw)
    calls = _forced_calls(parsed["tool_calls"], forced)
    message: dict[str, Any] = {"role": "assistant", "content": parsed["content"],
                               "reasoning_content": parsed["reasoning_content"]}
    if calls:
        message["tool_calls"] = calls
        if reason == "stop":
            reason = "tool_calls"
    return message, reason


class ChatDeltas:
    """The streamed deltas of one chat choice; they add up to :func:`chat_message`'s message.

    ``forced``: None (no call required), ``""`` (``tool_choice: required``) or the tool name a
    named ``tool_choice`` gives; with a name, calls to other tools are left out of the stream
    (as :func:`chat_message` leaves them out). ``feed(text, finished=...)`` per decoded output
    returns the non-empty deltas it makes certain; ``close(reason)`` returns the final finish
    reason (``tool_calls`` after a call, in place of ``stop``) and the error event to send when
    a required call is missing (None otherwise).
    """

    def __init__(self, pkw: dict[str, Any] | None, forced: str | None) -> None:
        self.forced = forced
        self.stream = MessageStream(**pkw) if pkw is not None else None
        self.called = False
        self._dropped: set[int] = set()

    def feed(self, text: str, *, finished: bool = False) -> list[dict[str, Any]]:
        if self.stream is None:
            return [{"content": text}] if text else []
        deltas = [self.stream.feed(text)] if text else []
        if finished:
            deltas.append(self.stream.finish())
        return [d for d in map(self._keep_forced, deltas) if d]

    def _keep_forced(self, delta: dict[str, Any]) -> dict[str, Any]:
        calls = delta.pop("tool_calls", None)
        if not calls:
            return delta
        kept = []
        for c in calls:
            if "id" in c and self.forced and c["function"].get("name") != self.forced:
                self._dropped.add(c["index"])
            if c["index"] not in self._dropped:
                kept.append(c)
        if kept:
            delta["tool_calls"] = kept
            self.called = True
        return delta

    def close(self, reason: str | None) -> tuple[str | None, dict[str, Any] | None]:
        error = None
        if self.forced is not None and not self.called:
            error = error_body(_no_call_message(self.forced), param="tool_choice",
                               code="tool_call_missing")
        if self.called and reason == "stop":
            reason = "tool_calls"
        return reason, error
