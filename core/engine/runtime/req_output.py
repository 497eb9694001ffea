"""What one step does to a request's output: its token appended, its end checked (stop token,
stop string, grammar, length), the text that can be sent without revealing a possible stop
string, and the counts of its output delta. Shared by the scheduler and speculative decoding's
verification."""

from __future__ import annotations

import logging
from typing import Any

from engine.runtime import prompt_logprobs
from engine.runtime.grammar import GrammarDeadEnd
from engine.runtime.request import Req, ReqOutput
from engine.runtime.sampling import SampleOutput

log = logging.getLogger("engine.scheduler")


def next_output(req: Req, out: SampleOutput, i: int, now: float, max_context_len: int
                ) -> ReqOutput:
    """Append row ``i``'s token of ``out`` to ``req``, check whether it finished (a context
    of ``max_context_len`` tokens is full); its output delta."""
    if req.max_new_tokens == 0:  # prompt-only request: prefilled, nothing generated
        req.finish_reason = {"type": "length"}
        delta = ReqOutput(rid=req.rid)
        fill_counts(req, delta)
        _prompt_logprobs(req, delta)
        return delta
    tok = out.token_ids[i]
    if req.unresolved:  # the oldest placeholder is this token's
        req.output_ids[len(req.output_ids) - req.unresolved] = tok
        req.unresolved -= 1
    else:
        req.output_ids.append(tok)
    if req.grammar is not None and not req.grammar.accept(tok):
        raise RuntimeError(f"the grammar matcher refused token {tok}, which its mask allowed")
    if req.first_token_time is None:
        req.first_token_time = now
    delta = ReqOutput(rid=req.rid, token_ids=[tok])
    if out.logprobs is not None and (req.sampling_params.logprobs
                                     or req.sampling_params.top_logprobs):
        delta.logprobs = [out.logprobs[i]]
        delta.top_logprobs = [out.top_logprobs[i]] if out.top_logprobs else [[]]
        if req.sampling_params.token_ids_logprob and out.ids_logprobs is not None:
            delta.ids_logprobs = [out.ids_logprobs[i]]
    check_finish(req, tok, max_context_len)
    delta.text = new_text(req)
    fill_counts(req, delta)
    _prompt_logprobs(req, delta)
    return delta


def _prompt_logprobs(req: Req, delta: ReqOutput) -> None:
    """The prompt's log-probabilities on ``req``'s first output, where it asked for them."""
    taken = prompt_logprobs.take(req)
    if taken is not None:
        (delta.input_token_ids, delta.input_logprobs, delta.input_top_logprobs,
         delta.input_ids_logprobs) = taken


def error_output(req: Req, message: str) -> ReqOutput:
    """End ``req`` with an internal error (whatever it had reached); its last output."""
    log.error("request %s failed: %s", req.rid, message)
    req.finish_reason = {"type": "abort", "message": message}
    delta = ReqOutput(rid=req.rid)
    fill_counts(req, delta)
    return delta


def check_finish(req: Req, tok: int, max_context_len: int) -> None:
    """End ``req`` if ``tok`` (just appended) is a stop token, completes a stop string, ends its
    grammar, or reaches its length or the context's."""
    sp = req.sampling_params
    n_out = len(req.output_ids) - req.unresolved
    if tok in req.stop_ids and n_out >= sp.min_new_tokens:
        finish(req, {"type": "stop", "matched": tok})
        return
    old = len(req.text)
    req.text += req.detokenizer.add(tok)
    if match_stop(req, old):
        return
    if req.grammar is not None and req.grammar.is_terminated():
        finish(req, {"type": "stop"})
        return
    if n_out >= req.max_new_tokens or req.known_len >= max_context_len:
        finish(req, {"type": "length"})


def match_stop(req: Req, old_len: int) -> bool:
    """Cut the text at the first stop string that appears after ``old_len`` - its length."""
    stops = req.sampling_params.stop
    if not stops or len(req.output_ids) < req.sampling_params.min_new_tokens:
        return False
    start = max(0, old_len - max(len(s) for s in stops) + 1)
    hits = [(i, s) for s in stops if (i := req.text.find(s, start)) >= 0]
    if not hits:
        return False
    i, s = min(hits)
    req.text = req.text[:i]
    req.finish_reason = {"type": "stop", "matched": s}
    return True


def finish(req: Req, reason: dict[str, Any]) -> None:
    """End ``req`` (first reason wins); flush the detokenizer, which may reveal a stop."""
    if req.finish_reason is not None:
        return
    old = len(req.text)
    req.text += req.detokenizer.finish()
    if not match_stop(req, old):
        req.finish_reason = reason


def new_text(req: Req) -> str:
    """Text that can be sent now: all of it when finished, else minus a possible stop."""
    end = len(req.text)
    if not req.finished and req.sampling_params.stop:
        end -= held_back(req.text, req.sampling_params.stop)
    if end <= req.sent_len:
        return ""
    piece = req.text[req.sent_len:end]
    req.sent_len = end
    return piece


def fill_counts(req: Req, delta: ReqOutput) -> None:
    """The delta's finish state and token counts (prompt, completion, cached, speculative)."""
    delta.finished = req.finished
    delta.finish_reason = req.finish_reason
    delta.prompt_tokens = len(req.origin_input_ids)
    delta.completion_tokens = len(req.output_ids) - req.unresolved
    delta.cached_tokens = req.cached_tokens
    delta.cached_tokens_details = req.cached_tiers
    delta.spec_verify_ct, delta.spec_accepted_tokens = (req.spec_verify_ct,
                                                        req.spec_accepted_tokens)
    if req.finished:
        delta.time_stats = {"arrival": req.arrival, "scheduled": req.scheduled_time,
                            "first_token": req.first_token_time}


def held_back(text: str, stops: list[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of some stop string."""
    for k in range(min(len(text), max(len(s) for s in stops) - 1), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0


def failure(where: str, exc: BaseException) -> str:
    """The message of a request ended by ``exc`` (``where``: "while sampling", ...)."""
    return f"internal error {where}: {type(exc).__name__}: {exc}"


def sample_failure(exc: BaseException) -> str:
    """The message of a request whose draw failed: a grammar's dead end as it says, anything
    else an internal error."""
    return str(exc) if isinstance(exc, GrammarDeadEnd) else failure("while sampling", exc)
